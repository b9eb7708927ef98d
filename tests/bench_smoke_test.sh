#!/usr/bin/env bash
# Smoke test of the benchmark programs (tools/bench, issue 6): each starts
# and exits cleanly with tiny sizes and prints the lines run.sh collects, and
# report.py turns them into a table. Measures nothing; installs nothing.
# PyTorch's scripts run only when /usr/bin/python3 has torch; the MLP
# programs only when Fashion-MNIST is installed (dataset-fashion-mnist).
# Usage: bench_smoke_test.sh OVERHEAD SUMMARY CHECKPOINT TRAIN RECOVERY BENCH_SRC_DIR
set -u
overhead=$1
summary=$2
checkpoint=$3
train=$4
recovery=$5
src=$6
data=${FOREMAN_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
python=/usr/bin/python3
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() { grep -Eq -- "$1" <<<"$2"; }
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/bench_smoke_test.XXXXXX") || { echo "cannot create a temporary directory under ${TEST_TMPDIR:-/tmp}" >&2; exit 1; }
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/results" "$tmp/scratch"
runs=$tmp/results/runs.txt
: >"$runs"
gb=(--benchmark_min_time=0.001 --benchmark_repetitions=2 --benchmark_enable_random_interleaving=true
    --benchmark_out_format=json)

# -- 2. runtime overhead ---------------------------------------------------------------
out=$(TMPDIR=$tmp/scratch timeout 120 "$overhead" "${gb[@]}" --benchmark_out="$tmp/results/overhead.json" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "overhead_bench exited $rc: $out"
for b in BM_BareStep BM_SessionRun BM_MonitoredSessionNoHooks BM_MonitoredTrainingSession; do
  has "^$b/real_time_median " "$out" || fail "overhead_bench: no median for $b: $out"
done
has 'ERROR OCCURRED' "$out" && fail "overhead_bench reported an error: $out"

# -- 4. summaries ----------------------------------------------------------------------
out=$(TMPDIR=$tmp/scratch timeout 120 "$summary" "${gb[@]}" --benchmark_out="$tmp/results/summary.json" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "summary_bench exited $rc: $out"
for b in BM_SummaryWriterActor/1000 BM_EventFileWriterDirect/1000; do
  has "^$b/real_time_median .*items_per_second=" "$out" || fail "summary_bench: no events/s for $b: $out"
done
has 'ERROR OCCURRED' "$out" && fail "summary_bench reported an error: $out"

# -- 3. checkpoints (1 MB; torch.save when present) ----------------------------------------
torch_args=()
have_torch=0
if "$python" -c 'import torch' 2>/dev/null; then
  have_torch=1
  torch_args=(--torch "$python $src/checkpoint_torch.py")
fi
out=$(timeout 120 "$checkpoint" --sizes-mb 1 --reps 1 --dir "$tmp/scratch" "${torch_args[@]}" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "checkpoint_bench exited $rc: $out"
for f in stall_s stall_cpu_s stall_page_faults waited_saves memcpy_fresh_s memcpy_warm_s memcpy_warm_cpu_s write_s write_MBps \
         write_first_s syncs_per_save dd_MBps write_vs_dd dd_nsync_MBps write_vs_dd_nsync; do
  has "^RESULT ckpt\.1MB\.$f median=[0-9.e+-]+ min=.* n=[0-9]+ unit=" "$out" || fail "checkpoint_bench: no $f: $out"
done
((have_torch)) && ! has '^RESULT ckpt\.1MB\.torch_save_MBps ' "$out" && fail "checkpoint_bench: no torch.save: $out"
grep '^RESULT' <<<"$out" >>"$runs"
[[ -z $(ls -A "$tmp/scratch") ]] || fail "checkpoint_bench left files behind: $(ls -R "$tmp/scratch")"

# -- 1, 5. the MLP: training throughput and recovery ----------------------------------------
if [[ -f $data/train-images-idx3-ubyte.gz ]]; then
  out=$(timeout 120 "$train" --data "$data" --threads 1 --steps 3 --warmup 1 2>&1)
  rc=$?
  [[ $rc -eq 0 ]] || fail "train_bench exited $rc: $out"
  has '^RUN train\.foreman\.t1\.samples_per_s [0-9.e+]+ samples/s$' "$out" || fail "train_bench: $out"
  grep '^RUN' <<<"$out" >>"$runs"
  if ((have_torch)); then
    out=$(timeout 120 "$python" "$src/train_torch.py" --data "$data" --threads 1 --steps 3 --warmup 1 2>&1)
    rc=$?
    [[ $rc -eq 0 ]] || fail "train_torch.py exited $rc: $out"
    has '^RUN train\.torch\.t1\.samples_per_s [0-9.e+]+ samples/s$' "$out" || fail "train_torch.py: $out"
    grep '^RUN' <<<"$out" >>"$runs"
  fi
  out=$(timeout 180 "$recovery" --data "$data" --reps 1 --abort-at 3 --dir "$tmp/scratch" 2>&1)
  rc=$?
  [[ $rc -eq 0 ]] || fail "recovery_bench exited $rc: $out"
  has '^RUN recovery\.default_backoff_s [0-9.e+-]+ s$' "$out" || fail "recovery_bench: $out"
  has '^RUN recovery\.no_backoff_s [0-9.e+-]+ s$' "$out" || fail "recovery_bench: $out"
  has 'Recovered from a preemption error' "$out" || fail "recovery_bench did not recover: $out"
  grep '^RUN' <<<"$out" >>"$runs"
else
  echo "SKIP: no Fashion-MNIST in $data: train_bench and recovery_bench not run"
fi

# -- the table ------------------------------------------------------------------------------
echo "model: smoke" >"$tmp/results/machine.txt"
out=$("$python" "$src/report.py" "$tmp/results" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "report.py exited $rc: $out"
has '^\| 2 \| runtime overhead per step' "$out" || fail "report.py: no overhead row: $out"
has '^\| 3 \| 1 MB: training-loop stall per save' "$out" || fail "report.py: no checkpoint row: $out"
has '^\| 3 \| 1 MB: background write, [0-9]+ syncs per save \(MB/s\) \| [0-9]' "$out" ||
  fail "report.py: no row against dd with the save's syncs: $out"
has '^\| 4 \| summaries through the summary_writer actor \(events/s\) \| [0-9]' "$out" || fail "report.py: $out"

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "bench smoke OK"
