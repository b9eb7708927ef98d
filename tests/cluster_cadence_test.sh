#!/usr/bin/env bash
# Cadence in a cluster (issue 31 point 5; docs/cluster.md "Cadence:
# evaluation, progress, --epochs"). A ps, the chief (worker 0) and worker 1
# on 127.0.0.1, asynchronous: worker 1's updates carry global_step forward
# between two of the chief's steps, so a cadence keyed on
# "global_step % N == 0" skips multiples.
#   1. --eval-every-steps K, --max-steps M: the chief's progress lines (one
#      per chief step, --log-step-count-steps 1) give the global_step after
#      each of its steps; the chief evaluates (eval/ events, tag accuracy)
#      exactly at its first step at or past each multiple of K (one event
#      for the multiples one step passed, none for a multiple twice, none
#      skipped) and at the final global_step ("training ended at
#      global_step F"). Every progress line of both workers shows the
#      cluster's total, M ("step N/M"), and an ETA once the rate is known.
#      The check is only meaningful when some chief step passed a multiple
#      without landing on it: the test fails if none did.
#   2. --epochs E (no --max-steps): the cluster's end is
#      ceil(E x 60000 / batch) global steps, shared by the workers
#      (MlpJob::total_steps, ClusterStepsForEpochs): the chief's header says
#      "N steps", every progress line of both workers says "/N", both
#      workers and the ps exit 0, training ends at global_step F in
#      [N, N + slack] (updates in flight, as at --max-steps), the chief
#      trained fewer than N steps itself, and worker 1 ended at the chief's
#      end or at its own StopAtStepHook at a global_step in [N, F].
#      (Before, each worker counted its own epochs: the chief ended at
#      its own E epochs, global_step ~2N.)
#
#   cluster_cadence_test.sh FOREMAN HEARTBEAT_MS CONNECTION_TIMEOUT_MS MAX_STEPS EVERY EPOCHS BATCH
set -u
foreman=$1
heartbeat_ms=$2
timeout_ms=$3
max_steps=$4
every=$5
epochs=$6
batch=$7
NAME=cluster_cadence_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"
bound=60
slack=20  # worker 1's updates between the chief's last step and its end of training

# Starts a ps, worker 1, then (once worker 1 waits for the chief's session)
# the chief, with the model flags "$@"; each one's output in $tmp/$run.*.out;
# waits for all three (bounded); their exit codes in ps_rc, chief_rc, worker_rc.
run_cluster() {
  local run=$1 ports ps_port chief_port worker_port net
  shift
  ports=$(free_ports 3) || { fail "cannot find free ports"; return 1; }
  read -r ps_port chief_port worker_port <<<"$ports"
  net=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "127.0.0.1:$chief_port,127.0.0.1:$worker_port"
       --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms")
  "$foreman" train "$@" "${net[@]}" --job-name ps --task-index 0 --ps-join-timeout-secs "$bound" \
    --checkpoint-dir "$tmp/$run.ps_unused" >"$tmp/$run.ps.out" 2>&1 &
  local ps_pid=$!
  pids+=("$ps_pid")
  "$foreman" train "$@" "${net[@]}" --job-name worker --task-index 1 --checkpoint-dir "$tmp/$run.unused" \
    --ps-wait-secs "$bound" >"$tmp/$run.worker1.out" 2>&1 &
  local worker_pid=$!
  pids+=("$worker_pid")
  wait_for_line "^foreman train: worker 1 of 2" "$tmp/$run.worker1.out" "$bound" "$worker_pid" \
    || fail "$run: worker 1 did not start: $(cat "$tmp/$run.worker1.out")"
  "$foreman" train "$@" "${net[@]}" --job-name worker --task-index 0 --checkpoint-dir "$tmp/$run" \
    --save-checkpoint-secs 600 --ps-wait-secs "$bound" >"$tmp/$run.chief.out" 2>&1 &
  local chief_pid=$!
  pids+=("$chief_pid")
  wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
  wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
  wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
}

# The global_step of each progress line ("step N/T: ...") of file $1.
progress_steps() { sed -n 's/^step \([0-9]*\)[/:].*/\1/p' "$1"; }
# The totals ("/T") of the progress lines of file $1, one per distinct value.
progress_totals() { sed -n 's/^step [0-9]*\(\/[0-9]*\)\{0,1\}:.*/\1/p' "$1" | sort -u | tr '\n' ' '; }
# Checks that every progress line of file $2 shows the total $3 ($1 names
# it) and no step past it but by the updates in flight at the end (never
# "step 800/469").
check_totals() {
  local who=$1 file=$2 total=$3 totals last
  totals=$(progress_totals "$file")
  [[ $totals == "/$total " ]] || fail "$who's progress lines show the totals '${totals}', expected only /$total"
  last=$(progress_steps "$file" | sort -n | tail -n 1)
  [[ -z $last || $last -le $((total + slack)) ]] || fail "$who's progress reached step $last/$total"
}

# -- 1. Evaluation at every multiple ------------------------------------------------

model=(--hidden 32 --batch-size 50 --threads 1 --optimizer adam --seed 7 --log-step-count-steps 1)
run_cluster eval "${model[@]}" --max-steps "$max_steps" --eval-every-steps "$every"
chief_out=$(cat "$tmp/eval.chief.out")
worker_out=$(cat "$tmp/eval.worker1.out")
[[ $chief_rc -eq 0 ]] || fail "eval: the chief exited $chief_rc: $(tail -n 20 <<<"$chief_out")"
[[ $worker_rc -eq 0 ]] || fail "eval: worker 1 exited $worker_rc: $(tail -n 20 <<<"$worker_out")"
[[ $ps_rc -eq 0 ]] || fail "eval: the ps exited $ps_rc: $(cat "$tmp/eval.ps.out")"
final=$(sed -n 's/^training ended at global_step \([0-9]*\)$/\1/p' <<<"$chief_out")
[[ $final =~ ^[0-9]+$ ]] || fail "eval: the chief did not say where it ended training"
check_totals "eval: the chief" "$tmp/eval.chief.out" "$max_steps"
check_totals "eval: worker 1" "$tmp/eval.worker1.out" "$max_steps"
# After the first few steps the rate is known: no "ETA ?".
unknown=$(grep -E '^step [0-9]+' "$tmp/eval.chief.out" | tail -n +4 | grep -c 'ETA ?$')
((unknown == 0)) || fail "eval: $unknown of the chief's progress lines after its third show 'ETA ?'"
k1=$(sed -n 's/^worker 1: trained \([0-9]*\) steps.*/\1/p' <<<"$worker_out")
[[ $k1 =~ ^[0-9]+$ && $k1 -ge 1 ]] || fail "eval: worker 1 trained no step"
"$foreman" events --json --tag accuracy "$tmp/eval/eval" >"$tmp/eval.events.json" 2>&1 \
  || fail "eval: foreman events failed: $(cat "$tmp/eval.events.json")"
# The expected evaluations from the chief's steps, compared with the events.
if [[ $final =~ ^[0-9]+$ ]]; then
  progress_steps "$tmp/eval.chief.out" >"$tmp/eval.chief_steps"
  verdict=$("$py" - "$tmp/eval.chief_steps" "$tmp/eval.events.json" "$every" "$final" <<'EOF'
import json, sys
steps = [int(x) for x in open(sys.argv[1]).read().split()]
k, final = int(sys.argv[3]), int(sys.argv[4])
events = []
for line in open(sys.argv[2]):
    line = line.strip()
    if line.startswith("{"):
        e = json.loads(line)
        if e.get("tag") == "accuracy" and "step" in e:
            events.append(int(e["step"]))
problems = []
if steps != sorted(set(steps)):
    problems.append("the chief's steps do not increase: %s" % steps[:40])
# The chief's first step at or past each multiple of k (StepMultiplesCrossed > 0).
expected, prev, jumped = [], 0, 0
for s in steps:
    crossed = s // k - prev // k
    if crossed > 0:
        expected.append(s)
        if s % k != 0:
            jumped += 1  # a multiple passed without landing on it: "% k == 0" misses it
    prev = s
if not expected or expected[-1] != final:
    expected.append(final)
if len(events) != len(set(events)):
    problems.append("an evaluation written twice at one step: %s" % events)
if events != expected:
    missing = sorted(set(expected) - set(events))
    extra = sorted(set(events) - set(expected))
    problems.append("evaluations at %s, expected %s (missing %s, not expected %s)"
                    % (events, expected, missing, extra))
if jumped == 0:
    problems.append("no chief step passed a multiple of %d without landing on it: the cluster did not "
                    "interleave (chief steps %s)" % (k, steps[:40]))
print("ok %d evaluations, %d multiples passed by a jump, %d chief steps" % (len(events), jumped, len(steps))
      if not problems else "FAIL " + "; ".join(problems))
EOF
  )
  echo "eval: $verdict"
  [[ $verdict == ok* ]] || fail "eval: ${verdict#FAIL }"
fi

# -- 2. --epochs in a cluster ---------------------------------------------------------

model=(--hidden 32 --batch-size "$batch" --threads 1 --optimizer adam --seed 7 --log-step-count-steps 1
       --eval-every-steps 0)
n=$(((epochs * 60000 + batch - 1) / batch))  # Fashion-MNIST: 60000 training examples
run_cluster epochs "${model[@]}" --max-steps 0 --epochs "$epochs"
chief_out=$(cat "$tmp/epochs.chief.out")
worker_out=$(cat "$tmp/epochs.worker1.out")
[[ $chief_rc -eq 0 ]] || fail "epochs: the chief exited $chief_rc: $(tail -n 20 <<<"$chief_out")"
[[ $worker_rc -eq 0 ]] || fail "epochs: worker 1 exited $worker_rc: $(tail -n 20 <<<"$worker_out")"
[[ $ps_rc -eq 0 ]] || fail "epochs: the ps exited $ps_rc: $(cat "$tmp/epochs.ps.out")"
has "^foreman train: MLP .*, $n steps," "$chief_out" || fail "epochs: the chief's header does not say $n steps: \
$(grep -E '^foreman train: MLP' <<<"$chief_out")"
check_totals "epochs: the chief" "$tmp/epochs.chief.out" "$n"
check_totals "epochs: worker 1" "$tmp/epochs.worker1.out" "$n"
final=$(sed -n 's/^training ended at global_step \([0-9]*\)$/\1/p' <<<"$chief_out")
k0=$(sed -n 's/^worker 0: trained \([0-9]*\) steps.*/\1/p' <<<"$chief_out")
k1=$(sed -n 's/^worker 1: trained \([0-9]*\) steps.*/\1/p' <<<"$worker_out")
w1_last=$(progress_steps "$tmp/epochs.worker1.out" | tail -n 1)
echo "epochs: N = $n, training ended at global_step ${final:-?}; worker 0 trained ${k0:-?}, worker 1 ${k1:-?}" \
     "(its last step ${w1_last:-?})"
if [[ $final =~ ^[0-9]+$ ]]; then
  ((final >= n && final <= n + slack)) || fail "epochs: training ended at global_step $final, expected [$n, $((n + slack))]"
else
  fail "epochs: the chief did not say where it ended training: $(tail -n 20 <<<"$chief_out")"
fi
[[ $k0 =~ ^[0-9]+$ && $k0 -lt $n ]] || fail "epochs: the chief trained '${k0}' steps itself (expected fewer than $n)"
[[ $k1 =~ ^[0-9]+$ && $k1 -ge 1 ]] || fail "epochs: worker 1 trained no step"
if ! has "^worker 1: the chief ended training" "$worker_out"; then
  [[ $w1_last =~ ^[0-9]+$ && $final =~ ^[0-9]+$ && $w1_last -ge $n && $w1_last -le $final ]] \
    || fail "epochs: worker 1 neither saw the chief's end nor stopped in [$n, ${final:-?}] (its last step ${w1_last:-?})"
fi

if ((failures > 0)); then
  for f in eval.chief eval.worker1 epochs.chief epochs.worker1; do
    echo "--- $f:"; grep -Ev '^step [0-9]+' "$tmp/$f.out" | tail -n 30
  done
  failures_summary
  exit 1
fi
echo "PASS"
