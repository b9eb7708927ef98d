#!/usr/bin/env bash
# Builds a folder that runs tools/scripts/gpu-check.sh on a GPU machine without
# Foreman's Debian packages (../shared/notes/gpu-machine.md: no CAF, Abseil,
# protobuf, spdlog, LevelDB there, no network): the programs and every shared
# library `ldd` lists for them except glibc's own (libc, libm, libdl,
# libpthread, librt, the loader), libgcc_s and libstdc++ (that machine's are
# newer) and the CUDA driver's (libcuda, libnvidia-*: the machine's own must
# be used).
#
#   .gpu-bundle/gpu-check.sh      the check (finds bin/, lib/, data/ beside it)
#   .gpu-bundle/bin/              foreman, train_bench, kernel_bench, tcp_roundtrip, the `gpu` suite's programs
#                                 and `cuda` (cuda_test): each a small sh script
#                                 that runs libexec/'s program of that name with
#                                 LD_LIBRARY_PATH=lib/ (for it and its children
#                                 only: Python and PyTorch keep the machine's own
#                                 OpenSSL, zlib, ...)
#   .gpu-bundle/libexec/          the programs themselves
#   .gpu-bundle/lib/              their shared libraries, and libforeman's
#                                 dlopened plug-ins: the CPU kernels
#                                 (libforeman_cpu_*.so) and the CUDA device
#                                 (libforeman_cuda.so) with libcudart
#   .gpu-bundle/data/             Fashion-MNIST's four .gz files
#   .gpu-bundle/tests.txt         the test programs: name<TAB>program[<TAB>args]
#   .gpu-bundle/tools/bench/      run.sh, cluster_bench.sh, report.py and
#                                 train_torch.py (gpu-check.sh's --cpu-threads,
#                                 --cluster and --with-torch; run.sh --bin-dir bin)
#
# The bundle must fit what travels to the GPU machine with the working tree
# (64 MiB): gpu-bundle.sh fails when it is larger, and says its size.
#
# Copy the folder to the GPU machine and run `.gpu-bundle/gpu-check.sh` there
# (it writes its logs under ./gpu-check-<time>/ and prints one line per figure).
#
# Usage: tools/scripts/gpu-bundle.sh [--build-dir DIR] [--out DIR] [--data DIR] [--no-build] [--no-data]
#   --build-dir  a configured release build (default build-release); built
#                first (ninja) unless --no-build
#   --out        the bundle folder (default .gpu-bundle; it is replaced)
#   --data       Fashion-MNIST (default /usr/share/datasets/fashion-mnist)
#   --no-data    leave data/ empty (gpu-check.sh then wants --data)
# The defaults are in the repository's root; a relative path given is the
# caller's (from the directory it was run in).
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/../.."
root=$PWD
mine() { if [[ $1 == /* ]]; then echo "$1"; else echo "$caller/$1"; fi; }
build_dir=build-release
out=.gpu-bundle
data=/usr/share/datasets/fashion-mnist
build=1
copy_data=1
while (($#)); do
  case $1 in
    --build-dir|--out|--data)
      (($# >= 2)) || { echo "gpu-bundle.sh: $1 wants a value (see --help)" >&2; exit 2; } ;;&
    --build-dir) build_dir=$(mine "$2"); shift ;;
    --out) out=$(mine "$2"); shift ;;
    --data) data=$(mine "$2"); shift ;;
    --no-build) build=0 ;;
    --no-data) copy_data=0 ;;
    -h|--help) sed -n '2,/^set -e/{/^set -e/!p}' "$0"; exit 0 ;;
    *) echo "gpu-bundle.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
log() { echo "gpu-bundle.sh: $*" >&2; }
[[ -f $build_dir/build.ninja ]] || { log "$build_dir is not a configured build directory (tools/scripts/build.sh release)"; exit 1; }
build_dir=$(cd "$build_dir" && pwd)

# The `gpu` suite's programs and `cuda`, from meson's own list of tests.
tests_tsv=$(meson introspect --tests "$build_dir" | /usr/bin/python3 -c '
import json, sys
for t in json.load(sys.stdin):
    if any(s.split(":")[-1] == "gpu" for s in t["suite"]) or t["name"] == "cuda":
        print("\t".join([t["name"]] + t["cmd"]))')
[[ -n $tests_tsv ]] || { log "meson lists no gpu tests in $build_dir"; exit 1; }
programs=("$build_dir/tools/foreman" "$build_dir/tools/bench/train_bench" "$build_dir/tests/kernel_bench"
          "$build_dir/tools/bench/tcp_roundtrip")
while IFS=$'\t' read -r name prog _; do programs+=("$prog"); done <<<"$tests_tsv"

if ((build)); then
  targets=()
  for p in "${programs[@]}"; do targets+=("${p#"$build_dir"/}"); done
  ninja -C "$build_dir" "${targets[@]}" >&2
fi

if [[ -e $out && ! -f $out/BUILD.txt ]]; then
  log "$out exists and is not a bundle (no BUILD.txt): not replacing it"; exit 1
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/libexec" "$out/lib" "$out/data" "$out/tools/bench"
for p in "${programs[@]}"; do
  [[ -x $p ]] || { log "$p is missing (build it, or leave out --no-build)"; exit 1; }
  name=$(basename "$p")
  cp "$p" "$out/libexec/"
  # The build's RUNPATH names this machine's build tree; LD_LIBRARY_PATH
  # (searched first) points the program at the bundle's lib/ wherever the
  # bundle is copied.
  cat >"$out/bin/$name" <<EOF
#!/bin/sh
# $name from a Foreman GPU bundle (tools/scripts/gpu-bundle.sh), with the bundle's libraries.
bundle=\$(cd "\$(dirname "\$(readlink -f "\$0")")/.." && pwd)
LD_LIBRARY_PATH="\$bundle/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$bundle/libexec/$name" "\$@"
EOF
  chmod +x "$out/bin/$name"
done
for f in run.sh cluster_bench.sh report.py train_torch.py; do cp "$root/tools/bench/$f" "$out/tools/bench/"; done
cp "$root/tools/scripts/gpu-check.sh" "$out/gpu-check.sh"
# Tests as name<TAB>program basename<TAB>args (arguments verbatim).
while IFS=$'\t' read -r name prog args; do
  printf '%s\t%s\t%s\n' "$name" "$(basename "$prog")" "${args:-}"
done <<<"$tests_tsv" >"$out/tests.txt"

# libforeman's plug-ins, which it dlopens from its own directory (not in
# the programs' ldd lists): the CPU kernels for AVX2 and AVX-512 and the
# CUDA device (libforeman_cuda.so, which needs libcudart).
modules=()
for k in "$build_dir"/src/libforeman_cpu_*.so "$build_dir"/src/libforeman_cuda.so; do
  [[ -e $k ]] && modules+=("$k")
done
[[ -e $build_dir/src/libforeman_cuda.so ]] || log "note: $build_dir has no libforeman_cuda.so (built without CUDA): the bundle can only say so"
# Shared libraries: everything ldd resolves, less the system's and the driver's.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libgcc_s\.so|libstdc\+\+\.so|libcuda\.so|libnvidia-|libcublas)'
missing=()
for p in "${programs[@]}" "${modules[@]}"; do
  while read -r lib arrow path _; do
    [[ $arrow == "=>" ]] || continue
    base=$(basename "$lib")
    [[ $base =~ $skip ]] && continue
    if [[ $path == "not" ]]; then missing+=("$base (for $(basename "$p"))"); continue; fi
    [[ -e $out/lib/$base ]] || cp -L "$path" "$out/lib/$base"
  done < <(ldd "$p")
done
((${#missing[@]} == 0)) || { log "ldd cannot find: ${missing[*]}"; exit 1; }
for k in "${modules[@]}"; do cp -L "$k" "$out/lib/"; done

if ((copy_data)); then
  for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    [[ -f $data/$f ]] || { log "$data/$f is missing (Debian: dataset-fashion-mnist)"; exit 1; }
    cp "$data/$f" "$out/data/"
  done
fi
{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')$( ((build)) || echo '; --no-build: the programs may predate these sources')"
  echo "build: $build_dir"
} >"$out/BUILD.txt"
size_kib=$(du -sk "$out" | cut -f1)
size=$(awk -v k="$size_kib" 'BEGIN { printf "%.1f MiB", k / 1024 }')
log "$out: $(ls "$out/bin" | wc -l) programs, $(ls "$out/lib" | wc -l) libraries, $size in all"
echo "size: $size" >>"$out/BUILD.txt"
if ((size_kib > 64 * 1024)); then
  log "$out is $size: over the 64 MiB that travels to the GPU machine (../shared/notes/gpu-machine.md)"; exit 1
fi
log "on the GPU machine: $out/gpu-check.sh"
