#!/usr/bin/env bash
# Evictions (issue 31 point 1; docs/cluster.md "Failures"): a SIGTERM is how
# Kubernetes evicts a pod, and it must not end the job. A ps, the chief
# (worker 0) and worker 1 train an asynchronous run to --max-steps:
#   1. worker 1 gets a SIGTERM while it trains: it stops at the step
#      boundary and exits 75 ("stopped, not finished"), saying that it
#      writes no checkpoint (the chief does); started again, it rejoins.
#   2. the chief gets a SIGTERM while it trains: it takes its final
#      checkpoint and exits 75, without ending training on the ps ("training
#      goes on"; no "training ended at global_step"); the ps and worker 1 go
#      on running, and worker 1 trains on.
#   3. the chief, started again with the same flags and directory,
#      re-attaches to the ps without restoring it (as after a kill -9) and
#      the run ends at --max-steps: the chief's last checkpoint is at the
#      global_step training ended, at least --max-steps (asynchronous
#      training, as TF1's: worker 1's updates between the chief's last step
#      and its end of training carry it a few past, at most 20 here), and
#      every task exits 0.
# A cluster given --signal-ends-training (the explicit request, which
# `foreman cluster local` gives its chief) keeps the old rule: tests
# cluster_e2e and cluster_cli.
#
#   cluster_evict_test.sh FOREMAN HEARTBEAT_MS CONNECTION_TIMEOUT_MS MAX_STEPS
set -u
foreman=$1
heartbeat_ms=$2
timeout_ms=$3
max_steps=$4
NAME=cluster_evict_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"
stopped=75  # docs/cluster.md: "stopped, not finished"

# The steps of the checkpoints in directory $1, ascending.
checkpoint_steps() {
  local f
  for f in "$1"/model.ckpt-*.index; do
    [[ -e $f ]] || continue
    f=${f##*/model.ckpt-}
    echo "${f%.index}"
  done | sort -n
}

ports=$(free_ports 3) || { echo "FAIL: cannot find free ports"; exit 1; }
read -r ps_port chief_port worker_port <<<"$ports"
model=(--hidden 32 --batch-size 50 --threads 1 --max-steps "$max_steps" --optimizer adam --seed 7
       --log-step-count-steps 1 --eval-every-steps 0)
net=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "127.0.0.1:$chief_port,127.0.0.1:$worker_port"
     --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms")
ckpt=$tmp/run
bound=60
chief=("$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index 0 --checkpoint-dir "$ckpt"
       --save-checkpoint-steps 1000000 --ps-wait-secs "$bound")
worker1=("$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index 1 --checkpoint-dir "$tmp/unused"
         --ps-wait-secs "$bound")
finish_report() {
  echo "--- ps:"; cat "$tmp/ps.out"
  for f in chief chief2 worker1 worker1b; do
    [[ -e $tmp/$f.out ]] && { echo "--- $f:"; grep -Ev '^step [0-9]+' "$tmp/$f.out" | tail -n 40; }
  done
  failures_summary
  exit 1
}

"$foreman" train "${model[@]}" "${net[@]}" --job-name ps --task-index 0 --ps-join-timeout-secs "$bound" \
  --checkpoint-dir "$tmp/ps_unused" >"$tmp/ps.out" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
"${worker1[@]}" >"$tmp/worker1.out" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
"${chief[@]}" >"$tmp/chief.out" 2>&1 &
chief_pid=$!
pids+=("$chief_pid")
wait_for_steps "$tmp/chief.out" 2 "$bound" "$chief_pid" || fail "the chief trained no step"
wait_for_steps "$tmp/worker1.out" 2 "$bound" "$worker_pid" || fail "worker 1 trained no step"
((failures == 0)) || finish_report

# 1. Worker 1 evicted, then started again.
kill -TERM "$worker_pid" 2>/dev/null
wait_bounded "$worker_pid" "$bound"
worker_out=$(cat "$tmp/worker1.out")
[[ $rc -eq $stopped ]] || fail "worker 1 stopped by SIGTERM exited $rc, expected $stopped"
has "SIGTERM received: worker 1 stops at the next step boundary; it writes no checkpoint" "$worker_out" \
  || fail "worker 1's signal message"
! has "saving a final checkpoint|after its final checkpoint" "$worker_out" \
  || fail "worker 1 promised a checkpoint it does not write: $(grep -E "final checkpoint" <<<"$worker_out")"
has "^worker 1: stopped by SIGTERM, not finished \(exit $stopped\)" "$worker_out" || fail "worker 1's last line"
kill -0 "$chief_pid" 2>/dev/null || fail "the chief exited at worker 1's eviction"
"${worker1[@]}" >"$tmp/worker1b.out" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
wait_for_steps "$tmp/worker1b.out" 2 "$bound" "$worker_pid" || fail "worker 1 started again trained no step"
((failures == 0)) || finish_report

# 2. The chief evicted: final checkpoint, exit 75, training goes on.
kill -TERM "$chief_pid" 2>/dev/null
wait_bounded "$chief_pid" "$bound"
chief_out=$(cat "$tmp/chief.out")
[[ $rc -eq $stopped ]] || fail "the chief stopped by SIGTERM exited $rc, expected $stopped"
has "^stopped by SIGTERM after its final checkpoint at global_step [0-9]+; training goes on" "$chief_out" \
  || fail "the chief's last line"
! has "training ended at global_step|ended training" "$chief_out" || fail "the chief's eviction ended training"
evicted_at=$(checkpoint_steps "$ckpt" | tail -n 1)
[[ -n $evicted_at && $evicted_at -gt 0 && $evicted_at -lt $max_steps ]] \
  || fail "the evicted chief's final checkpoint is at step '${evicted_at}' (expected in (0, $max_steps))"
down=$(steps_in "$tmp/worker1b.out")
wait_for_steps "$tmp/worker1b.out" "$((down + 5))" "$bound" "$worker_pid" \
  || fail "worker 1 did not train on after the chief's eviction"
kill -0 "$ps_pid" 2>/dev/null || fail "the ps exited at the chief's eviction: $(cat "$tmp/ps.out")"
kill -0 "$worker_pid" 2>/dev/null || fail "worker 1 exited at the chief's eviction"
((failures == 0)) || finish_report

# 3. The chief again: it re-attaches and the run ends at --max-steps.
"${chief[@]}" >"$tmp/chief2.out" 2>&1 &
chief_pid=$!
pids+=("$chief_pid")
wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
chief_out=$(cat "$tmp/chief2.out")
[[ $chief_rc -eq 0 ]] || fail "the restarted chief exited $chief_rc"
[[ $worker_rc -eq 0 ]] || fail "worker 1 exited $worker_rc"
[[ $ps_rc -eq 0 ]] || fail "the ps exited $ps_rc"
has "re-attached to the ps at global_step [0-9]+ \(latest checkpoint [0-9]+\): not restoring" "$chief_out" \
  || fail "the restarted chief did not re-attach to the ps"
! has "Restoring parameters from" "$chief_out" || fail "the restarted chief restored the ps (a rewind)"
final=$(sed -n 's/^training ended at global_step \([0-9]*\)$/\1/p' <<<"$chief_out")
if [[ $final =~ ^[0-9]+$ ]]; then
  ((final >= max_steps && final <= max_steps + 20)) \
    || fail "training ended at global_step $final, expected --max-steps $max_steps (or a few past it)"
  [[ $(checkpoint_steps "$ckpt" | tail -n 1) == "$final" ]] \
    || fail "the latest checkpoint is not at the final step $final: $(checkpoint_steps "$ckpt" | tr '\n' ' ')"
else
  fail "the restarted chief did not say where it ended training"
fi
has "^ps task 0: training ended" "$(cat "$tmp/ps.out")" || fail "the ps did not see training end"
((failures == 0)) || finish_report
echo "worker 1 evicted and rejoined; chief evicted at checkpoint $evicted_at; training ended at $final"
echo "cluster_evict_test: OK"
