#!/usr/bin/env bash
# `meson install` into a staging directory puts the public headers,
# libforeman (with a versioned SONAME), foreman.pc and foreman-actors.pc in
# place; then programs of every kind the docs show build with nothing but
# the pkg-config line and run: a program using every public header but the
# actor API, the four examples (tools/examples) — the synchronous API
# (MonitoredTrainingSession), the actor API (CAF), Supervisor.managed_session
# and fault injection (foreman/fault.hpp) — and foreman train as a library
# program (tests/support/installed_mlp_job.cpp: the run directory and the MLP
# job), which trains, resumes, and is refused exactly as the installed
# `foreman train` is on a directory whose checkpoints do not verify.
# No source tree and no build tree is on any include or library path, and
# no LD_LIBRARY_PATH: the staged install is moved elsewhere before anything
# is built from it, programs are compiled with -Wall -Wextra -Werror, and
# they (and the installed `foreman`) run with LD_LIBRARY_PATH unset: their
# rpaths (pkg-config's, $ORIGIN-relative for `foreman`) find libforeman.
#
# Usage: install_test.sh BUILD_DIR SOURCE_ROOT [SANITIZE]
#   SANITIZE: meson's b_sanitize of that build ("none", "address,undefined"):
#   a program linking a sanitized libforeman must be built with the same.
set -uo pipefail
build_dir=$1
source_root=$2
sanitize=${3:-none}
extra=()
[[ $sanitize == none ]] || extra=(-fsanitize="$sanitize")
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
stage=$(mktemp -d "${TEST_TMPDIR:-/tmp}/foreman-install.XXXXXX") || exit 1
trap 'rm -rf "$stage"' EXIT

meson install -C "$build_dir" --no-rebuild --destdir "$stage/installed" --quiet >/dev/null || { echo "FAIL: meson install"; exit 1; }
# Relocated: every path the install wrote is gone; only relative ones can work.
mv "$stage/installed" "$stage/moved" || { echo "FAIL: cannot move the staged install"; exit 1; }

pc=$(find "$stage" -name foreman.pc -print -quit)
[[ -n "$pc" ]] || { echo "FAIL: foreman.pc not installed"; exit 1; }
[[ -f $(dirname "$pc")/foreman-actors.pc ]] || fail "foreman-actors.pc not installed next to foreman.pc"
# Relocatable: prefix is relative to the .pc file, so the staged copy works as is.
grep -q '^prefix=${pcfiledir}/' "$pc" || fail "foreman.pc's prefix is not relative to the .pc file: $(grep '^prefix=' "$pc")"

# Every public header in the source tree is installed (nn.hpp, dataset.hpp,
# input_pipeline.hpp were once missing), and nothing else is.
incdir=$(find "$stage" -type d -path '*include/foreman' -print -quit)
[[ -n $incdir ]] || { echo "FAIL: no include/foreman installed"; exit 1; }
for h in "$source_root"/include/foreman/*.hpp; do
  [[ -f $incdir/$(basename "$h") ]] || fail "public header $(basename "$h") is not installed"
done
[[ -f $incdir/version.hpp ]] || fail "version.hpp is not installed"
[[ -z $(find "$incdir" -name '*.cpp') ]] || fail "sources installed as headers"

export PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --cflags --libs foreman) || { echo "FAIL: pkg-config foreman: $flags"; exit 1; }
actor_flags=$(pkg-config --cflags --libs foreman-actors) || { echo "FAIL: pkg-config foreman-actors"; exit 1; }
echo "pkg-config foreman: $flags"
echo "pkg-config foreman-actors: $actor_flags"
# (The stage itself may lie under the build tree: TEST_TMPDIR.)
staged_flags="$flags $actor_flags"
staged_flags=${staged_flags//$stage/STAGE}
for bad in SPDLOG "$(cd "$source_root" && pwd)" "$(cd "$build_dir" && pwd)"; do
  [[ $staged_flags != *"$bad"* ]] || fail "pkg-config's flags carry '$bad': $staged_flags"
done
# Abseil is Required (its own link lines), not copied; its -DNOMINMAX is
# undone by foreman-nominmax's -UNOMINMAX after it.
requires=$(pkg-config --print-requires foreman)
for m in absl_status absl_statusor absl_strings absl_time foreman-nominmax; do
  grep -qx "$m" <<<"$requires" || fail "foreman.pc does not Require $m: $requires"
done
! grep -q -- '-labsl' "$pc" || fail "foreman.pc lists Abseil's libraries by hand: $(grep '^Libs' "$pc")"
# Only what the public headers need: nothing drags in the private libraries' .pc files.
private=$(pkg-config --print-requires-private foreman foreman-actors)
[[ -z $private ]] || fail "Requires.private: $private"
[[ $actor_flags == *-lcaf_core* ]] || fail "foreman-actors does not link libcaf_core: $actor_flags"

libdir=$(pkg-config --variable=libdir foreman)
soname=$(readelf -d "$libdir/libforeman.so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
version=$(pkg-config --modversion foreman)
[[ $soname == "libforeman.so.${version%.*}" ]] || fail "SONAME is '$soname', want libforeman.so.${version%.*}"
[[ -f $libdir/$soname ]] || fail "no $soname in $libdir"

# Each program: copied out of the tree, compiled with the pkg-config line alone.
mkdir -p "$stage/src"
cp "$source_root/tests/support/installed_hello.cpp" "$source_root/tests/support/installed_mlp_job.cpp" \
   "$source_root"/tools/examples/*.cpp \
   "$source_root"/tools/examples/*.hpp "$stage/src/"
build() {  # build NAME PKG_FLAGS...
  local name=$1; shift
  (cd "$stage/src" && c++ -std=c++17 -Wall -Wextra -Werror "${extra[@]}" "$name.cpp" -o "$name" "$@") ||
    fail "$name did not build with -Wall -Wextra -Werror and: $*"
}
# A user's own `#define NOMINMAX` (as Windows-minded code has) must not warn
# "redefined" under -Werror: the flags leave NOMINMAX undefined.
printf '#define NOMINMAX\n#include "foreman/status.hpp"\nint main() { return foreman::Status().ok() ? 0 : 1; }\n' \
  >"$stage/src/nominmax.cpp"
build nominmax $flags
build installed_hello $flags
build sync_training $flags
build supervisor_training $flags
build actor_training $actor_flags
build fault_injection $flags
build installed_mlp_job $flags

# The typed handle: a message outside the job's protocol does not compile.
cp "$source_root/tests/support/typed_job_misuse.cpp" "$stage/src/"
(cd "$stage/src" && c++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only typed_job_misuse.cpp $actor_flags) ||
  fail "typed_job_misuse.cpp with a correct message did not compile"
misuse=$(cd "$stage/src" && c++ -std=c++17 -fsyntax-only -DFOREMAN_MISUSE typed_job_misuse.cpp $actor_flags 2>&1) &&
  fail "sending a ProgressStep to a training_job_actor compiled"
grep -q 'receiver does not accept given message' <<<"$misuse" || fail "the misuse failed for another reason: $misuse"

# run NAME ARGS...: runs a built program in the stage with the installed
# library; prints its output; fails the test on a missing binary or a
# non-zero exit (then prints nothing).
run() {
  local name=$1; shift
  [[ -x $stage/src/$name ]] || return 0  # its build failure is counted
  local rc=0
  (cd "$stage" && env -u LD_LIBRARY_PATH timeout 120 "$stage/src/$name" "$@") >"$stage/$name.out" 2>&1 || rc=$?
  [[ $rc -eq 0 ]] || { fail "$name $* exited $rc: $(cat "$stage/$name.out")"; return 1; }
}
run installed_hello && { out=$(cat "$stage/installed_hello.out")
  [[ $out == "hello from foreman "* ]] || fail "installed_hello printed '$out'"; }
run sync_training "$stage/sync" 60 && { out=$(cat "$stage/sync_training.out")
  grep -q '^runs: 60$' <<<"$out" || fail "sync_training: $out"
  [[ -f $stage/sync/model.ckpt-60.index ]] || fail "sync_training wrote no model.ckpt-60: $(ls "$stage/sync")"; }
run supervisor_training "$stage/sv" 60 && { out=$(cat "$stage/supervisor_training.out")
  grep -q '^global_step: 6[01]$' <<<"$out" || fail "supervisor_training: $out"; }
run actor_training "$stage/actor" 60 && { out=$(cat "$stage/actor_training.out")
  grep -q '^training job finished: OK$' <<<"$out" || fail "actor_training: $out"
  [[ -f $stage/actor/model.ckpt-60.index ]] || fail "actor_training wrote no model.ckpt-60: $(ls "$stage/actor")"; }
echo '{"seed": 3, "faults": []}' >"$stage/empty_plan.json"
run fault_injection "$stage/faults" "$stage/empty_plan.json" && { out=$(cat "$stage/fault_injection.out")
  grep -q '^runs: 200, recoveries: 0$' <<<"$out" || fail "fault_injection with an empty plan: $out"; }

# foreman train as a library program, on Fashion-MNIST (dataset-fashion-mnist):
# a run, its resume, then the refusal of a run whose checkpoints are all
# corrupt, word for word the installed `foreman train`'s.
data=/usr/share/datasets/fashion-mnist
foreman=$(find "$stage" -path '*/bin/foreman' -type f -print -quit)
[[ -n $foreman ]] || fail "foreman is not installed"
if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  fail "no Fashion-MNIST in $data (tools/scripts/install-deps.sh installs dataset-fashion-mnist)"
elif run installed_mlp_job "$stage/mlp" "$data" 20; then
  out=$(cat "$stage/installed_mlp_job.out")
  grep -q '^trained 20 steps$' <<<"$out" && grep -q '^test accuracy [0-9.]* at global_step 20$' <<<"$out" \
    || fail "installed_mlp_job: $out"
  grep -q '^hidden = 4$' "$stage/mlp/train_settings.txt" || fail "installed_mlp_job stored no settings: $(ls "$stage/mlp")"
  run installed_mlp_job "$stage/mlp" "$data" 30 && { out=$(cat "$stage/installed_mlp_job.out")
    grep -q "^resuming from $stage/mlp/model.ckpt-20\$" <<<"$out" && grep -q '^trained 10 steps$' <<<"$out" \
      || fail "installed_mlp_job did not resume: $out"; }
  for f in "$stage"/mlp/model.ckpt-*.data-*; do printf 'corrupt' | dd of="$f" bs=1 seek=0 conv=notrunc status=none; done
  lib_out=$(cd "$stage" && env -u LD_LIBRARY_PATH timeout 120 "$stage/src/installed_mlp_job" "$stage/mlp" "$data" 40 2>&1)
  lib_rc=$?
  cli_out=$(cd "$stage" && env -u LD_LIBRARY_PATH timeout 120 "$foreman" train --checkpoint-dir "$stage/mlp" 2>&1)
  cli_rc=$?
  lib_line=$(grep '^installed_mlp_job: cannot resume: ' <<<"$lib_out" | sed 's/^installed_mlp_job: //')
  cli_line=$(grep '^foreman train: cannot resume: ' <<<"$cli_out" | sed 's/^foreman train: //')
  [[ $lib_rc -eq 2 && $cli_rc -eq 2 ]] || fail "corrupt checkpoints: installed_mlp_job exited $lib_rc, foreman train $cli_rc: $lib_out / $cli_out"
  [[ $lib_line == "cannot resume: no checkpoint in $stage/mlp can be restored "*"; to start fresh on purpose, remove $stage/mlp or use another --checkpoint-dir" ]] \
    || fail "installed_mlp_job's refusal: '$lib_line' ($lib_out)"
  [[ -n $lib_line && $lib_line == "$cli_line" ]] || fail "the library program and foreman train are refused differently: '$lib_line' vs '$cli_line'"
fi

# Without LD_LIBRARY_PATH, the programs and `foreman` resolve the moved
# libforeman, `foreman` through an rpath relative to itself.
if [[ -n $foreman ]]; then
  runpath=$(readelf -d "$foreman" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
  [[ $runpath == '$ORIGIN/'* ]] || fail "foreman's RUNPATH is '$runpath', not relative to \$ORIGIN"
  resolved=$(env -u LD_LIBRARY_PATH ldd "$foreman" | sed -n 's/.*libforeman\.so[.0-9]* => \([^ ]*\).*/\1/p')
  [[ $(realpath -m "$resolved") == $(realpath "$libdir")/* ]] || fail "foreman resolves libforeman to '$resolved', not in $libdir"
fi
resolved=$(env -u LD_LIBRARY_PATH ldd "$stage/src/installed_hello" 2>/dev/null | sed -n 's/.*libforeman\.so[.0-9]* => \([^ ]*\).*/\1/p')
[[ $(realpath -m "$resolved") == $(realpath "$libdir")/* ]] || fail "installed_hello resolves libforeman to '$resolved', not in $libdir"

# The CPU kernel modules sit next to libforeman, and the installed library
# loads them (it logs a warning naming a module it cannot load).
for isa in avx2 avx512; do
  [[ -f $libdir/libforeman_cpu_$isa.so ]] || fail "libforeman_cpu_$isa.so is not installed next to libforeman"
done
if grep -q 'cannot load libforeman_cpu' "$stage"/*.out; then
  fail "an installed program could not load a CPU kernel module: $(grep -h 'cannot load' "$stage"/*.out)"
fi

# The CUDA device is a plug-in (libforeman_cuda.so, dlopen()ed on first
# use): libforeman, foreman and a user's program link no CUDA library, and
# with the module removed (a machine without the CUDA runtime is the same
# case: the module cannot load) `foreman devices` and `--device auto` say
# why and the CPU trains; `--device gpu:0` is refused naming the module.
cuda_libs='libcuda\.|libcudart|libcublas|libnvidia'
for f in "$libdir/$soname" "$foreman" "$stage/src/installed_hello"; do
  [[ -e $f ]] || continue
  linked=$(env -u LD_LIBRARY_PATH ldd "$f" | grep -E "$cuda_libs") && fail "$(basename "$f") links CUDA: $linked"
done
module=$libdir/libforeman_cuda.so
if [[ -f $build_dir/src/libforeman_cuda.so ]]; then
  [[ -f $module ]] || fail "libforeman_cuda.so is not installed next to libforeman"
  exported=$(nm -D --defined-only "$module" 2>/dev/null | awk '{print $3}' | sort | tr '\n' ' ')
  [[ $exported == "foreman_cuda_module_v1 " ]] || fail "libforeman_cuda.so exports more than its entry point: $exported"
  mv "$module" "$stage/" || fail "cannot remove the CUDA module"
  why='the CUDA module .*libforeman_cuda\.so cannot be loaded: .*libforeman_cuda\.so: cannot open shared object file'
else
  why='CUDA support was not built'
fi
if [[ -n $foreman && ! -e $module ]]; then
  out=$(env -u LD_LIBRARY_PATH timeout 60 "$foreman" devices 2>&1); rc=$?
  [[ $rc -eq 0 ]] && grep -q '^/cpu:0: ' <<<"$out" && grep -Eq "^no CUDA devices: $why" <<<"$out" ||
    fail "foreman devices without the CUDA module exited $rc: $out"
  tiny=(--data-dir "$data" --hidden 8 --batch-size 64 --threads 1 --eval-every-steps 0 --max-steps 10)
  out=$(cd "$stage" && env -u LD_LIBRARY_PATH timeout 120 "$foreman" train --checkpoint-dir "$stage/auto" "${tiny[@]}" \
        --device auto 2>&1); rc=$?
  [[ $rc -eq 0 ]] && grep -Eq "^foreman train: --device auto: no usable GPU \(.*$why.*\); training on the CPU$" <<<"$out" \
    && [[ -f $stage/auto/model.ckpt-10.index ]] || fail "foreman train --device auto without the CUDA module exited $rc: $out"
  out=$(cd "$stage" && env -u LD_LIBRARY_PATH timeout 60 "$foreman" train --checkpoint-dir "$stage/gpu" "${tiny[@]}" \
        --device gpu:0 2>&1); rc=$?
  [[ $rc -eq 2 ]] && grep -Eq "^foreman train: cannot use --device gpu:0: .*($why|built without)" <<<"$out" ||
    fail "foreman train --device gpu:0 without the CUDA module exited $rc (want 2, naming the module): $out"
fi
# A truncated module beside libforeman (a damaged install) is refused with
# what is wrong, before dlopen() (which dies of SIGBUS mapping it), and no
# other copy is loaded instead: the CUDA module, and the CPU kernel module
# this CPU uses (a warning, then the next lower kernels: AVX2's for a
# truncated AVX-512 module, the baseline for AVX2's).
if [[ -n $foreman && -f $stage/libforeman_cuda.so ]]; then
  head -c 10000 "$stage/libforeman_cuda.so" >"$module"
  out=$(env -u LD_LIBRARY_PATH timeout 60 "$foreman" devices 2>&1); rc=$?
  [[ $rc -eq 0 ]] && grep -Eq "^no CUDA devices: the CUDA module .*/libforeman_cuda\.so cannot be loaded: .*/libforeman_cuda\.so: truncated: a loadable segment ends at byte [0-9]+, the file has 10000 " <<<"$out" ||
    fail "foreman devices with a truncated CUDA module exited $rc: $out"
  out=$(cd "$stage" && env -u LD_LIBRARY_PATH timeout 120 "$foreman" train --checkpoint-dir "$stage/auto2" "${tiny[@]}" \
        --device auto 2>&1); rc=$?
  [[ $rc -eq 0 && -f $stage/auto2/model.ckpt-10.index ]] && grep -q 'truncated' <<<"$out" ||
    fail "foreman train --device auto with a truncated CUDA module exited $rc: $out"
  rm -f "$module"
fi
isa=$(env -u LD_LIBRARY_PATH timeout 60 "$foreman" devices 2>/dev/null | sed -En 's#^/cpu:0: (avx2|avx512) kernels.*#\1#p')
if [[ -n $foreman && -n $isa && -f $libdir/libforeman_cpu_$isa.so ]]; then
  kernels=$libdir/libforeman_cpu_$isa.so
  lower=baseline
  [[ $isa == avx512 && -f $libdir/libforeman_cpu_avx2.so ]] && lower=avx2
  cp "$kernels" "$stage/kernels.so"
  head -c 10000 "$stage/kernels.so" >"$kernels"
  out=$(env -u LD_LIBRARY_PATH timeout 60 "$foreman" devices 2>&1); rc=$?
  [[ $rc -eq 0 ]] && grep -Eq "CPU kernels: cannot load libforeman_cpu_$isa\.so \(.*truncated: a loadable segment" <<<"$out" &&
    grep -Eq "^/cpu:0: $lower kernels" <<<"$out" || fail "foreman devices with a truncated libforeman_cpu_$isa.so exited $rc: $out"
  cp "$stage/kernels.so" "$kernels"
  echo "install: a truncated libforeman_cpu_$isa.so is refused: $(grep -o 'CPU kernels: cannot load[^;]*' <<<"$out" | head -1)"
else
  echo "install: no CPU kernel module in use here (isa '${isa}'): the truncated-module case is not checked"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "install: the library, 3 .pc files and 7 programs built from the pkg-config line alone"
