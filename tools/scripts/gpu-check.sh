#!/usr/bin/env bash
# The one-command GPU check (issues 15 and 29), sized for a lent GPU machine
# (../shared/notes/gpu-machine.md: about 15 minutes a visit, at most 10 a
# command). Within --budget-s seconds (default 360) it runs
#   1. `foreman devices`                     (no usable GPU: says so, below)
#   2. the `gpu` suite's programs and `cuda`  (each: 0 passed, 77 skipped)
#   3. the main job, `foreman train --device gpu:0` (15 epochs), and a short
#      run moved GPU -> CPU -> GPU through its checkpoints (resume both ways)
#   4. the GPU benchmark: train_bench --device gpu:0 (samples/s at batch 128,
#      1024, 8192; the checkpoint stall against the device->host copy), and
#      with --with-torch tools/bench/train_torch.py --device cuda beside it
#      (the same batches and the main job); kernel_bench --device gpu:0 (the
#      step's kernels against the ones before issue 29, a line each)
#   5. with --cpu-threads LIST: the CPU thread-scaling rows (tools/bench/run.sh
#      --parts 1: train_bench at each thread count, pinned, batch 128 and 1024;
#      PyTorch at the same threads with --with-torch)
#   6. with --cluster: the cluster rows (run.sh --parts 6: one process, then
#      1 ps + N asynchronous workers for N in --workers, default 1,2,4,8, each
#      task on its own core where there are enough; 1 ps + 2 workers in sync
#      mode when 2 is among them; a ps-kill recovery)
# Every step runs under `timeout`, bounded by its own cap and by what is left
# of the budget; a step that cannot start in what is left fails with "out of
# time" (the logs so far stay). It prints one summary line per figure
# ("gpu-check: ...") and a last line "gpu-check: PASS|FAIL|SKIP ...". All
# output goes to one folder (--out; default ./gpu-check-<UTC time>),
# summary.txt included, written as the check goes.
#
# It runs in a build tree (tools/scripts/gpu-check.sh; the programs of
# --build-dir, default build-release, and meson's list of tests) or from a
# bundle made by tools/scripts/gpu-bundle.sh (.gpu-bundle/gpu-check.sh: bin/,
# lib/, data/, tools/bench/ and tests.txt beside it; bin/'s programs set
# LD_LIBRARY_PATH to the bundle's lib/ for themselves only, so Python and
# PyTorch keep the machine's own libraries).
#
# Exit: 0 every check passed (the speed targets are reported, met or missed,
# but do not fail the check), 1 a check failed or ran out of time (also: a
# GPU is listed but every gpu test skipped; `foreman devices` itself failed),
# 77 no usable GPU (with --cpu-threads or --cluster those still run first: 1
# if one of them failed), 2 bad usage.
#
# Usage: gpu-check.sh [--build-dir DIR] [--out DIR] [--data DIR] [--python PATH] [--budget-s N]
#                     [--with-torch] [--cpu-threads 1,8,16] [--cluster] [--workers 1,2,4,8]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build_dir=
out=
data=
python=${PYTHON:-python3}
budget_s=360
with_torch=0
cpu_threads=
cluster=0
workers=1,2,4,8
workers_given=0
usage() { echo "gpu-check.sh: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --build-dir|--out|--data|--python|--budget-s|--cpu-threads|--workers)
      (($# >= 2)) || usage "$1 wants a value (see --help)" ;;&
    --build-dir) build_dir=$2; shift ;;
    --out) out=$2; shift ;;
    --data) data=$2; shift ;;
    --python) python=$2; shift ;;
    --budget-s) budget_s=$2; shift ;;
    --with-torch) with_torch=1 ;;
    --cpu-threads) cpu_threads=$2; shift ;;
    --cluster) cluster=1 ;;
    --workers) workers=$2; workers_given=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/{/^set -uo/!p}' "$0"; exit 0 ;;
    *) usage "unknown option $1 (see --help)" ;;
  esac
  shift
done
[[ $budget_s =~ ^[1-9][0-9]*$ ]] || usage "--budget-s wants a whole number of seconds >= 1, not '$budget_s'"
list_ok() { [[ $1 =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]]; }
[[ -z $cpu_threads ]] || list_ok "$cpu_threads" || usage "--cpu-threads wants thread counts >= 1 separated by commas, not '$cpu_threads'"
list_ok "$workers" || usage "--workers wants worker counts >= 1 separated by commas, not '$workers'"
((workers_given && !cluster)) && usage "--workers $workers is for --cluster's rows; add --cluster"
# Absolute, because run.sh runs from its own directory.
[[ -z $data ]] || data=$(cd "$data" 2>/dev/null && pwd) || usage "--data: no directory '$data'"
if [[ $python == */* ]]; then
  python=$(cd "$(dirname "$python")" 2>/dev/null && pwd)/$(basename "$python") || usage "--python: no '$python'"
fi
started=$(date +%s)
deadline=$((started + budget_s))

# -- where the programs are ---------------------------------------------------------
if [[ -x $here/bin/foreman && -f $here/tests.txt && -z $build_dir ]]; then
  mode=bundle
  bin=$here/bin
  foreman=$bin/foreman
  train_bench=$bin/train_bench
  kernel_bench=$bin/kernel_bench
  bench_dir=$here/tools/bench
  tests_tsv=$(cat "$here/tests.txt")
  [[ -z $data ]] && data=$here/data
else
  mode=build
  root=$(cd "$here/../.." && pwd)
  build_dir=${build_dir:-$root/build-release}
  [[ -f $build_dir/build.ninja ]] || usage "$build_dir is not a configured build (or run .gpu-bundle/gpu-check.sh)"
  build_dir=$(cd "$build_dir" && pwd)
  bin=
  foreman=$build_dir/tools/foreman
  train_bench=$build_dir/tools/bench/train_bench
  kernel_bench=$build_dir/tests/kernel_bench
  bench_dir=$root/tools/bench
  tests_tsv=$(meson introspect --tests "$build_dir" 2>/dev/null | /usr/bin/python3 -c '
import json, sys
for t in json.load(sys.stdin):
    if any(s.split(":")[-1] == "gpu" for s in t["suite"]) or t["name"] == "cuda":
        print("\t".join([t["name"]] + t["cmd"]))' 2>/dev/null || true)
  [[ -z $data ]] && data=/usr/share/datasets/fashion-mnist
fi
if ((with_torch)) && ! "$python" -c 'import torch' 2>/dev/null; then
  usage "--with-torch: $python cannot import torch (--python names the interpreter that has it)"
fi
[[ -z $out ]] && out=$PWD/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
summary=$out/summary.txt
: >"$summary"
# Summary lines go to this script's stdout (fd 3) and summary.txt, also from
# inside a step whose own output is redirected to its log.
exec 3>&1
say() { echo "gpu-check: $*" | tee -a "$summary" >&3; }
failed=0
fail() { say "FAIL: $*"; failed=$((failed + 1)); }
elapsed() { echo $(($(date +%s) - started)); }

step_pid=
on_signal() {
  [[ -n $step_pid ]] && kill -TERM "$step_pid" 2>/dev/null && wait "$step_pid" 2>/dev/null
  say "FAIL: stopped by a signal after $(elapsed) s (logs so far in $out)"
  exit 1
}
trap on_signal TERM INT HUP

# bounded NAME CAP_S MIN_S CMD...: runs CMD under `timeout`, for CAP_S
# seconds or what is left of the budget, whichever is less. With less than
# MIN_S left it does not start CMD: it fails the check ("out of time") and
# returns 124. A timeout also fails the check, naming NAME. Returns CMD's
# exit status.
bounded() {
  local name=$1 cap=$2 min=$3; shift 3
  local left=$((deadline - $(date +%s)))
  if ((left < min)); then
    fail "$name: out of time (needs at least ${min} s, ${left} s of the ${budget_s} s budget left)"
    return 124
  fi
  ((cap > left - 2)) && cap=$((left - 2))  # --kill-after below: done by the budget's end
  ((cap < 1)) && cap=1
  # In the background, so that a signal to this script reaches the step
  # too (timeout runs in its own process group; on_signal passes it on).
  timeout --kill-after=2 "$cap" "$@" &
  step_pid=$!
  wait "$step_pid"
  local rc=$?
  step_pid=
  ((rc == 124 || rc == 137)) && fail "$name: stopped after ${cap} s (its cap or the budget's end)"
  return $rc
}

# run.sh's CPU rows (parts 1 and 6), one folder each under $out.
median() {  # median NAME RUNS_FILE: the median value of RUN NAME lines, or empty
  awk -v n="$1" '$1 == "RUN" && $2 == n { v[c++] = $3 } END {
    if (!c) exit; for (i = 0; i < c; i++) for (j = i + 1; j < c; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    printf "%.6g", (c % 2) ? v[int(c / 2)] : (v[c / 2 - 1] + v[c / 2]) / 2 }' "$2"
}
field_median() {  # field_median NAME KEY RUNS_FILE: the median of KEY=v on RUN NAME lines
  awk -v n="$1" -v k="$2" '$1 == "RUN" && $2 == n { for (i = 4; i <= NF; i++) if (index($i, k "=") == 1) v[c++] = substr($i, length(k) + 2) } END {
    if (!c) exit; for (i = 0; i < c; i++) for (j = i + 1; j < c; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
    printf "%.6g", (c % 2) ? v[int(c / 2)] : (v[c / 2 - 1] + v[c / 2]) / 2 }' "$3"
}
bench_args() {  # the run.sh options both CPU rows share
  local args=(--quick --no-install --out "$1" --data "$data" --python "$python")
  ((with_torch)) || args+=(--no-torch)
  if [[ $mode == bundle ]]; then args+=(--bin-dir "$bin"); else args+=(--build-dir "$build_dir"); fi
  printf '%s\n' "${args[@]}"
}
cpu_rows() {
  [[ -n $cpu_threads ]] || return 0
  local dir=$out/cpu-threads args
  mapfile -t args < <(bench_args "$dir")
  bounded "CPU thread scaling" 200 30 "$bench_dir/run.sh" "${args[@]}" --parts 1 --threads "$cpu_threads" \
    >"$out/cpu-threads.out" 2>"$out/cpu-threads.err"
  local rc=$?
  if ((rc != 0)); then
    ((rc == 124 || rc == 137)) || fail "CPU thread scaling: run.sh --parts 1 exited $rc: $(tail -1 "$out/cpu-threads.err") (logs: $out/cpu-threads.err, $dir/train.log)"
    return
  fi
  local t b prefix one ours peer ratio ts
  for b in 128 1024; do
    prefix=; ((b == 1024)) && prefix=b1024.
    one=$(median "train.foreman.${prefix}t1.samples_per_s" "$dir/runs.txt")
    IFS=, read -ra ts <<<"$cpu_threads"
    for t in "${ts[@]}"; do
      ours=$(median "train.foreman.${prefix}t$t.samples_per_s" "$dir/runs.txt")
      peer=$(median "train.torch.${prefix}t$t.samples_per_s" "$dir/runs.txt")
      ratio=$(awk -v a="${ours:-0}" -v b="${one:-0}" 'BEGIN { if (a > 0 && b > 0) printf " (%.2fx 1 thread)", a / b }')
      [[ $t == 1 ]] && ratio=
      say "CPU, $t thread(s), batch $b: Foreman ${ours:-not measured} samples/s$ratio, PyTorch ${peer:-not measured}$( ((with_torch)) || echo ' (no --with-torch)')"
    done
  done
  say "CPU thread scaling: table in $dir/table.md"
}
cluster_rows() {
  ((cluster)) || return 0
  local dir=$out/cluster args
  mapfile -t args < <(bench_args "$dir")
  bounded "cluster rows" 600 60 "$bench_dir/run.sh" "${args[@]}" --parts 6 --workers "$workers" \
    >"$out/cluster.out" 2>"$out/cluster.err"
  local rc=$?
  if ((rc != 0)); then
    ((rc == 124 || rc == 137)) || fail "cluster rows: run.sh --parts 6 exited $rc: $(tail -1 "$out/cluster.err") (logs: $out/cluster.err, $dir/cluster.log)"
    return
  fi
  local name single v cpu ratio
  single=$(median cluster.single "$dir/runs.txt")
  for name in $(awk '$1 == "RUN" && $2 ~ /^cluster\./ && $2 != "cluster.ps_kill_recovery_s" && !seen[$2]++ { print $2 }' "$dir/runs.txt"); do
    v=$(median "$name" "$dir/runs.txt")
    cpu=$(field_median "$name" cpu_ms_per_step "$dir/runs.txt")
    ratio=$(awk -v a="${v:-0}" -v b="${single:-0}" -v n="$name" 'BEGIN { if (a > 0 && b > 0 && n != "cluster.single") printf " (%.2fx one process)", a / b }')
    say "$name: ${v:-?} samples/s$ratio, CPU ${cpu:-?} ms per global step"
  done
  v=$(median cluster.ps_kill_recovery_s "$dir/runs.txt")
  [[ -n $v ]] && say "cluster.ps_kill_recovery_s: $v s"
  say "cluster rows: table in $dir/table.md"
}
finish() {  # finish GPU_RAN: the last line and the exit status
  if ((failed)); then
    say "FAIL: $failed check(s) failed in $(elapsed) s of a ${budget_s} s budget (logs in $out)"; exit 1
  elif (($1)); then
    say "PASS: every check passed in $(elapsed) s of a ${budget_s} s budget (logs in $out)"; exit 0
  fi
  say "SKIP: no usable GPU; the CPU rows asked for passed in $(elapsed) s (logs in $out)"; exit 77
}

# -- 1. the device --------------------------------------------------------------------------
bounded "foreman devices" 60 1 "$foreman" devices >"$out/devices.txt" 2>&1; rc=$?
devices=$(cat "$out/devices.txt")
if ((rc != 0)); then
  # It exits 0 without a GPU: anything else is a broken program or bundle.
  ((rc == 124 || rc == 137)) || fail "foreman devices exited $rc: $(tail -2 "$out/devices.txt" | tr '\n' ' ')"
  cpu_rows
  cluster_rows
  finish 0
fi
if ! grep -q '^[0-9]* CUDA device(s)' <<<"$devices"; then
  why=$(grep -m1 '^no CUDA devices' <<<"$devices" || tail -1 <<<"$devices")
  if [[ -z $cpu_threads ]] && ((!cluster)); then
    say "SKIP: no usable GPU (${why:-foreman devices said nothing}); nothing else was run"
    exit 77
  fi
  say "no usable GPU (${why:-foreman devices said nothing}): only the CPU rows asked for are run"
  cpu_rows
  cluster_rows
  finish 0
fi
say "mode: $mode; $(date -u +%Y-%m-%dT%H:%M:%SZ); $(uname -n); budget ${budget_s} s; logs in $out"
say "devices: $(grep -A1 '^[0-9]* CUDA device(s)' <<<"$devices" | tail -1 | sed 's/^ *//')"
[[ -f $here/BUILD.txt ]] && say "bundle: $(head -1 "$here/BUILD.txt")"

# -- 2. the gpu suite ------------------------------------------------------------------------
passed=() skipped=() failed_tests=()
[[ -n $tests_tsv ]] || fail "no gpu tests found ($mode mode)"
while IFS=$'\t' read -r name prog args; do
  [[ -n $name ]] || continue
  [[ $mode == bundle ]] && prog=$bin/$prog
  read -ra argv <<<"${args:-}"
  t0=$EPOCHREALTIME
  bounded "gpu test $name" 120 10 "$prog" "${argv[@]}" >"$out/test.$name.log" 2>&1; rc=$?
  t=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) passed+=("$name ${t}s") ;;
    77) skipped+=("$name") ;;
    *) failed_tests+=("$name (exit $rc, $out/test.$name.log)") ;;
  esac
done <<<"$tests_tsv"
say "gpu suite: ${#passed[@]} passed (${passed[*]:-none}), ${#skipped[@]} skipped (${skipped[*]:-none}), ${#failed_tests[@]} failed"
((${#failed_tests[@]} == 0)) || fail "gpu suite: ${failed_tests[*]}"
# A GPU is listed: a test that skips (77: no usable device) did not see it.
((${#skipped[@]} == 0)) || fail "gpu suite: ${skipped[*]} skipped although foreman devices lists a GPU"

# -- 3. the main job, and checkpoints moved between the GPU and the CPU -------------------------------
main=$out/main-job
bounded "main job" 120 20 "$foreman" train --device gpu:0 --data-dir "$data" --checkpoint-dir "$main" \
  >"$out/main-job.out" 2>"$out/main-job.err"
rc=$?
acc=$(sed -n 's/^test accuracy: \([0-9.]*\) .*/\1/p' "$out/main-job.out")
secs=$(sed -n 's/^trained \([0-9]*\) steps in \([0-9.]*\) s .*/\2/p' "$out/main-job.out")
steps=$(sed -n 's/^trained \([0-9]*\) steps in .*/\1/p' "$out/main-job.out")
if ((rc != 0)) || [[ -z $acc || -z $secs ]]; then
  ((rc == 124 || rc == 137)) || fail "main job: foreman train --device gpu:0 exited $rc: $(tail -3 "$out/main-job.err" | tr '\n' ' ')"
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
  bounded "checkpoints moved (leg on $dev)" 60 10 "$foreman" train "${small[@]}" --device "$dev" --max-steps "$last" \
    >>"$out/moved.out" 2>>"$out/moved.err"
  rc=$?
  if ((rc != 0)) || ! grep -q "global_step $last)" "$out/moved.out"; then
    ((rc == 124 || rc == 137)) || fail "checkpoints moved: the leg on $dev to step $last exited $rc ($out/moved.err)"
    ok=0; break
  fi
done
((ok)) && say "checkpoints moved: GPU to step 200, resumed on the CPU to 400, back on the GPU to 600: ok"
rm -rf "$moved"

# -- 4. the benchmark ------------------------------------------------------------------------
bounded "train_bench --device gpu:0" 120 20 "$train_bench" --data "$data" --device gpu:0 --batches 128,1024,8192 \
  --steps 400 --warmup 50 --save-every 50 --saves 20 >"$out/train_bench.out" 2>"$out/train_bench.err"
rc=$?
((rc == 0 || rc == 124 || rc == 137)) || fail "train_bench --device gpu:0 exited $rc ($out/train_bench.err)"
value() { sed -n "s/^RUN $1 \([^ ]*\) .*/\1/p" "$2" | head -1; }
: >"$out/torch.out"
if ((with_torch)); then
  if "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    for b in 128 1024 8192; do
      bounded "PyTorch at batch $b" 60 15 "$python" "$bench_dir/train_torch.py" --data "$data" --threads 1 --device cuda \
        --batch "$b" --steps 400 --warmup 50 >>"$out/torch.out" 2>>"$out/torch.err"
      rc=$?
      ((rc == 0 || rc == 124 || rc == 137)) || fail "train_torch.py --device cuda --batch $b exited $rc ($out/torch.err)"
    done
    bounded "PyTorch's main job" 90 20 "$python" "$bench_dir/train_torch.py" --data "$data" --threads 1 --device cuda \
      --epochs 15 >>"$out/torch.out" 2>>"$out/torch.err"
    rc=$?
    ((rc == 0 || rc == 124 || rc == 137)) || fail "train_torch.py --device cuda --epochs 15 exited $rc ($out/torch.err)"
  else
    fail "--with-torch: $python has no torch that sees a CUDA device"
  fi
fi
peer_note="not measured (no --with-torch)"
((with_torch)) && peer_note="not measured"
for b in 128 1024 8192; do
  mine=$(value "train.foreman.gpu.b$b.samples_per_s" "$out/train_bench.out")
  theirs=$(value "train.torch.cuda.b$b.samples_per_s" "$out/torch.out")
  target=""
  ((b == 128)) && target=$(awk -v v="${mine:-0}" 'BEGIN { print "; target >= 1 M: " ((v >= 1e6) ? "met" : "MISSED") }')
  ratio=$(awk -v a="${mine:-0}" -v b="${theirs:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')
  say "samples/s at batch $b: Foreman ${mine:-not measured}, PyTorch eager ${theirs:-$peer_note} ($ratio)$target"
done
torch_main=$(sed -n 's/^RUN train.torch.cuda.main_job_s \([^ ]*\) s accuracy=\([^ ]*\).*/\1 s, accuracy \2/p' "$out/torch.out")
torch_secs=${torch_main%% s,*}
speedup=$(awk -v a="${secs:-0}" -v b="${torch_secs:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx (target >= 5x: %s)", b / a, (b / a >= 5) ? "met" : "MISSED"; else print "-" }')
say "main job vs PyTorch eager: Foreman ${secs:-?} s, PyTorch ${torch_main:-$peer_note}; speed-up $speedup"
stall=$(value train.foreman.gpu.ckpt_stall_s "$out/train_bench.out")
copy=$(value train.foreman.gpu.ckpt_d2h_copy_s "$out/train_bench.out")
over=$(value train.foreman.gpu.ckpt_stall_over_copy "$out/train_bench.out")
say "checkpoint stall: ${stall:-?} s per save vs the device->host copy ${copy:-?} s = ${over:-?}x (target <= 1.2x: $(awk -v v="${over:-99}" 'BEGIN { print (v <= 1.2) ? "met" : "MISSED" }'))"

# The kernels against their predecessors (kernel_bench; alternated legs).
bounded "kernel_bench --device gpu:0" 90 20 "$kernel_bench" --device gpu:0 --reps 2 --replays 15 \
  >"$out/kernel_bench.out" 2>"$out/kernel_bench.err"
rc=$?
if ((rc == 0)); then
  while read -r _ name us _ base ratio; do
    say "kernel ${name#kernel.}: $us us per operation, before ${base#baseline=} us (${ratio#ratio=} faster)"
  done < <(grep '^RUN kernel\.' "$out/kernel_bench.out")
else
  ((rc == 124 || rc == 137)) || fail "kernel_bench --device gpu:0 exited $rc: $(tail -3 "$out/kernel_bench.err" | tr '\n' ' ')"
fi

# -- 5, 6. the CPU rows on this machine's cores ----------------------------------------------------
cpu_rows
cluster_rows
finish 1
