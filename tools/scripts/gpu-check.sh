#!/usr/bin/env bash
# The one-command GPU check (issue 15): on a machine with an NVIDIA GPU, in a
# few minutes, runs
#   1. `foreman devices`                     (no usable GPU: says so, exit 77)
#   2. the `gpu` suite's programs and `cuda`  (each: 0 passed, 77 skipped)
#   3. the main job, `foreman train --device gpu:0` (15 epochs), and a short
#      run moved GPU -> CPU -> GPU through its checkpoints (resume both ways)
#   4. the GPU benchmark: train_bench --device gpu:0 (samples/s at batch 128,
#      1024, 8192; the checkpoint stall against the device->host copy) and,
#      when this Python has torch with CUDA, tools/bench/train_torch.py
#      --device cuda beside it (the same batches and the main job)
# and prints one summary line per figure ("gpu-check: ..."). All output goes
# to one folder (--out; default ./gpu-check-<UTC time>), summary.txt included.
#
# It runs in a build tree (tools/scripts/gpu-check.sh; the programs of
# --build-dir, default build-release, and meson's list of tests) or from a
# bundle made by tools/scripts/gpu-bundle.sh (.gpu-bundle/gpu-check.sh: bin/,
# lib/, data/ and tests.txt beside it; Foreman's programs run with
# LD_LIBRARY_PATH=lib, plus cuBLAS from this machine's PyTorch when it has
# one; Python keeps the machine's own libraries).
#
# Exit: 0 every check passed (the speed targets are reported, met or missed,
# but do not fail the check), 1 a check failed, 77 no usable GPU.
#
# Usage: gpu-check.sh [--build-dir DIR] [--out DIR] [--data DIR] [--python PATH]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build_dir=
out=
data=
python=${PYTHON:-python3}
while (($#)); do
  case $1 in
    --build-dir) build_dir=$2; shift ;;
    --out) out=$2; shift ;;
    --data) data=$2; shift ;;
    --python) python=$2; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# -- where the programs are ---------------------------------------------------------
if [[ -x $here/bin/foreman && -f $here/tests.txt && -z $build_dir ]]; then
  mode=bundle
  bin=$here/bin
  foreman=$bin/foreman
  train_bench=$bin/train_bench
  torch_script=$bin/train_torch.py
  tests_tsv=$(cat "$here/tests.txt")
  [[ -z $data ]] && data=$here/data
  # Only Foreman's programs get the bundle's libraries (Python and PyTorch
  # keep the machine's own OpenSSL, zlib, ...). cuBLAS is not in the bundle
  # (over 500 MB): PyTorch's nvidia-cublas has it.
  ours_ld=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cublas=$("$python" -c 'import os, nvidia.cublas as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null || true)
  [[ -n $cublas && -d $cublas ]] && ours_ld=$ours_ld:$cublas
  ours=(env LD_LIBRARY_PATH="$ours_ld")
else
  mode=build
  ours=()
  root=$(cd "$here/../.." && pwd)
  build_dir=${build_dir:-$root/build-release}
  [[ -f $build_dir/build.ninja ]] || { echo "gpu-check.sh: $build_dir is not a configured build (or run .gpu-bundle/gpu-check.sh)" >&2; exit 2; }
  build_dir=$(cd "$build_dir" && pwd)
  foreman=$build_dir/tools/foreman
  train_bench=$build_dir/tools/bench/train_bench
  torch_script=$root/tools/bench/train_torch.py
  tests_tsv=$(meson introspect --tests "$build_dir" 2>/dev/null | "$python" -c '
import json, sys
for t in json.load(sys.stdin):
    if any(s.split(":")[-1] == "gpu" for s in t["suite"]) or t["name"] == "cuda":
        print("\t".join([t["name"]] + t["cmd"]))' 2>/dev/null || true)
  [[ -z $data ]] && data=/usr/share/datasets/fashion-mnist
fi
[[ -z $out ]] && out=$PWD/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out" || exit 1
summary=$out/summary.txt
: >"$summary"
say() { echo "gpu-check: $*" | tee -a "$summary"; }
failed=0
fail() { say "FAIL: $*"; failed=$((failed + 1)); }
started=$(date +%s)

# -- 1. the device --------------------------------------------------------------------------
devices=$(timeout 60 "${ours[@]}" "$foreman" devices 2>&1); rc=$?
echo "$devices" >"$out/devices.txt"
if ((rc != 0)) || ! grep -q '^[0-9]* CUDA device(s)' <<<"$devices"; then
  why=$(grep -m1 '^no CUDA devices' <<<"$devices" || tail -1 <<<"$devices")
  say "SKIP: no usable GPU (${why:-foreman devices exited $rc}); nothing else was run"
  exit 77
fi
say "mode: $mode; $(date -u +%Y-%m-%dT%H:%M:%SZ); $(uname -n); logs in $out"
say "devices: $(grep -A1 '^[0-9]* CUDA device(s)' <<<"$devices" | tail -1 | sed 's/^ *//')"
[[ -f $here/BUILD.txt ]] && say "bundle: $(head -1 "$here/BUILD.txt")"

# -- 2. the gpu suite ------------------------------------------------------------------------
passed=() skipped=() failed_tests=()
if [[ -z $tests_tsv ]]; then
  fail "no gpu tests found ($mode mode)"
fi
while IFS=$'\t' read -r name prog args; do
  [[ -n $name ]] || continue
  [[ $mode == bundle ]] && prog=$bin/$prog
  read -ra argv <<<"${args:-}"
  t0=$EPOCHREALTIME
  timeout 180 "${ours[@]}" "$prog" "${argv[@]}" >"$out/test.$name.log" 2>&1; rc=$?
  t=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) passed+=("$name ${t}s") ;;
    77) skipped+=("$name") ;;
    *) failed_tests+=("$name (exit $rc, $out/test.$name.log)") ;;
  esac
done <<<"$tests_tsv"
say "gpu suite: ${#passed[@]} passed (${passed[*]:-none}), ${#skipped[@]} skipped (${skipped[*]:-none}), ${#failed_tests[@]} failed"
((${#failed_tests[@]} == 0)) || fail "gpu suite: ${failed_tests[*]}"

# -- 3. the main job, and checkpoints moved between the GPU and the CPU -------------------------------
main=$out/main-job
timeout 300 "${ours[@]}" "$foreman" train --device gpu:0 --data-dir "$data" --checkpoint-dir "$main" >"$out/main-job.out" 2>"$out/main-job.err"
rc=$?
acc=$(sed -n 's/^test accuracy: \([0-9.]*\) .*/\1/p' "$out/main-job.out")
secs=$(sed -n 's/^trained \([0-9]*\) steps in \([0-9.]*\) s .*/\2/p' "$out/main-job.out")
steps=$(sed -n 's/^trained \([0-9]*\) steps in .*/\1/p' "$out/main-job.out")
if ((rc != 0)) || [[ -z $acc || -z $secs ]]; then
  fail "main job: foreman train --device gpu:0 exited $rc: $(tail -3 "$out/main-job.err" | tr '\n' ' ')"
else
  met=$(awk -v s="$secs" -v a="$acc" 'BEGIN { print (s <= 1.5 && a >= 0.88) ? "met" : "MISSED" }')
  say "main job: ${steps} steps in ${secs} s training time, test accuracy ${acc} (target <= 1.5 s and >= 0.88: $met)"
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.88) }' || fail "main job: test accuracy $acc < 0.88"
fi
echo "main job (foreman train --device gpu:0): $secs s, accuracy $acc" >"$out/main-job.txt"
rm -rf "$main"  # checkpoints and events: not needed in the logs
moved=$out/moved
small=(--data-dir "$data" --checkpoint-dir "$moved" --save-checkpoint-steps 100 --eval-every-steps 0)
ok=1
for leg in "gpu:0 200" "cpu 400" "gpu:0 600"; do
  read -r dev last <<<"$leg"
  timeout 120 "${ours[@]}" "$foreman" train "${small[@]}" --device "$dev" --max-steps "$last" >>"$out/moved.out" 2>>"$out/moved.err"
  rc=$?
  if ((rc != 0)) || ! grep -q "global_step $last)" "$out/moved.out"; then
    fail "checkpoints moved: the leg on $dev to step $last exited $rc ($out/moved.err)"; ok=0; break
  fi
done
((ok)) && say "checkpoints moved: GPU to step 200, resumed on the CPU to 400, back on the GPU to 600: ok"
rm -rf "$moved"

# -- 4. the benchmark ------------------------------------------------------------------------
timeout 300 "${ours[@]}" "$train_bench" --data "$data" --device gpu:0 --batches 128,1024,8192 --steps 400 --warmup 50 \
  --save-every 50 --saves 20 >"$out/train_bench.out" 2>"$out/train_bench.err"
rc=$?
((rc == 0)) || fail "train_bench --device gpu:0 exited $rc ($out/train_bench.err)"
value() { sed -n "s/^RUN $1 \([^ ]*\) .*/\1/p" "$2" | head -1; }
have_torch=0
if "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then have_torch=1; fi
: >"$out/torch.out"
if ((have_torch)); then
  for b in 128 1024 8192; do
    timeout 120 "$python" "$torch_script" --data "$data" --threads 1 --device cuda --batch "$b" --steps 400 --warmup 50 \
      >>"$out/torch.out" 2>>"$out/torch.err" || fail "train_torch.py --device cuda --batch $b failed ($out/torch.err)"
  done
  timeout 180 "$python" "$torch_script" --data "$data" --threads 1 --device cuda --epochs 15 \
    >>"$out/torch.out" 2>>"$out/torch.err" || fail "train_torch.py --device cuda --epochs 15 failed ($out/torch.err)"
else
  say "PyTorch: no torch with CUDA in $python: its figures were not measured"
fi
for b in 128 1024 8192; do
  mine=$(value "train.foreman.gpu.b$b.samples_per_s" "$out/train_bench.out")
  theirs=$(value "train.torch.cuda.b$b.samples_per_s" "$out/torch.out")
  target=""
  ((b == 128)) && target=$(awk -v v="${mine:-0}" 'BEGIN { print "; target >= 1 M: " ((v >= 1e6) ? "met" : "MISSED") }')
  ratio=$(awk -v a="${mine:-0}" -v b="${theirs:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')
  say "samples/s at batch $b: Foreman ${mine:-not measured}, PyTorch eager ${theirs:-not measured} ($ratio)$target"
done
torch_main=$(sed -n 's/^RUN train.torch.cuda.main_job_s \([^ ]*\) s accuracy=\([^ ]*\).*/\1 s, accuracy \2/p' "$out/torch.out")
torch_secs=${torch_main%% s,*}
speedup=$(awk -v a="${secs:-0}" -v b="${torch_secs:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx (target >= 5x: %s)", b / a, (b / a >= 5) ? "met" : "MISSED"; else print "-" }')
say "main job vs PyTorch eager: Foreman ${secs:-?} s, PyTorch ${torch_main:-not measured}; speed-up $speedup"
stall=$(value train.foreman.gpu.ckpt_stall_s "$out/train_bench.out")
copy=$(value train.foreman.gpu.ckpt_d2h_copy_s "$out/train_bench.out")
over=$(value train.foreman.gpu.ckpt_stall_over_copy "$out/train_bench.out")
say "checkpoint stall: ${stall:-?} s per save vs the device->host copy ${copy:-?} s = ${over:-?}x (target <= 1.2x: $(awk -v v="${over:-99}" 'BEGIN { print (v <= 1.2) ? "met" : "MISSED" }'))"

say "done in $(($(date +%s) - started)) s: $failed check(s) failed"
((failed == 0)) || exit 1
exit 0
