#!/usr/bin/env bash
# Configures (once) and builds one of Foreman's build directories.
#
# Usage: tools/scripts/build.sh release|asan|tsan [extra meson options...]
#   release  build-release: -O3, NDEBUG, warnings are errors
#   asan     build-asan:    -O1 -g1 with AddressSanitizer + UndefinedBehaviorSanitizer,
#                           warnings are errors, UB aborts (no recovery), no CUDA
#                           (nvcc's objects are not instrumented, and CI has no GPU:
#                           the release build compiles the CUDA code)
#   tsan     build-tsan:    -O2 -g1 with ThreadSanitizer, warnings are errors, no
#                           CUDA (run with TSAN_OPTIONS from test.sh: the
#                           suppressions in tools/sanitizers/tsan.supp)
# The sanitizer builds keep line tables only (-g1: reports still name each
# frame's function, file and line; no variables for a debugger): full -g
# made them a third slower to compile (actors/cluster_server.cpp under ASan:
# 145 s with -g, 94 s with -g1, measured on a busy 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/../.."

kind=${1:?usage: build.sh release|asan|tsan [meson options]}
shift
case $kind in
  release)
    dir=build-release
    opts=(-Dbuildtype=release -Dwerror=true)
    ;;
  asan)
    dir=build-asan
    opts=(-Dbuildtype=debugoptimized -Doptimization=1 -Db_sanitize=address,undefined -Db_lundef=false
          -Dwerror=true -Dcuda=disabled -Dcpp_args="['-fno-sanitize-recover=all','-g1']"
          -Dcpp_link_args=-fno-sanitize-recover=all)
    ;;
  tsan)
    dir=build-tsan
    # -Wno-tsan: Eigen's thread pool uses std::atomic_thread_fence, which
    # TSan does not model (GCC warns); its reports would name Eigen frames.
    opts=(-Dbuildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false -Dwerror=true -Dcuda=disabled
          -Dcpp_args="['-Wno-tsan','-g1']")
    ;;
  *) echo "build.sh: unknown build kind '$kind' (release|asan|tsan)" >&2; exit 2 ;;
esac

# foreman.pc relative to its own location (also in existing build directories,
# which predate the project default).
opts+=(-Dpkgconfig.relocatable=true)

if [[ -f $dir/build.ninja ]]; then
  meson configure "$dir" "${opts[@]}" "$@" >/dev/null
else
  meson setup "$dir" "${opts[@]}" "$@"
fi
ninja -C "$dir"
