#!/usr/bin/env bash
# A ps task evicted (issue 31 point 1, the ps part; docs/cluster.md "a ps
# task is evicted"): a SIGTERM to the ps of a 1 ps + chief + worker 1 run
# whose periodic checkpoints are far off (--save-checkpoint-steps 1000000:
# only the chief's checkpoint of step 0 exists):
#   1. the ps refuses updates ("ps task 0 (...) is stopping (evicted)"), the
#      chief takes a checkpoint at the global_step it reached, and the ps
#      exits 75 as soon as the chief has read it, within
#      --ps-eviction-grace-secs + slack;
#   2. the ps started again is restored by the chief from that checkpoint:
#      0 global steps lost ("... N restored; 0 steps lost", "recoveries: 1
#      (global steps lost: 0)"); worker 1 waited for the ps (no exit);
#   3. the run ends at --max-steps with exit 0 everywhere.
# Before this change the ps exited at once and the chief restored the
# checkpoint of step 0, losing every step (TF1 loses what follows the
# latest checkpoint: notes/cluster.md "Failures in TF1").
#
#   cluster_ps_evict_test.sh FOREMAN HEARTBEAT_MS CONNECTION_TIMEOUT_MS MAX_STEPS
set -u
foreman=$1
heartbeat_ms=$2
timeout_ms=$3
max_steps=$4
NAME=cluster_ps_evict_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"
stopped=75  # docs/cluster.md: "stopped, not finished"
grace=5     # --ps-eviction-grace-secs

ports=$(free_ports 3) || { echo "FAIL: cannot find free ports"; exit 1; }
read -r ps_port chief_port worker_port <<<"$ports"
model=(--hidden 32 --batch-size 50 --threads 1 --max-steps "$max_steps" --optimizer adam --seed 7
       --log-step-count-steps 1 --eval-every-steps 0)
net=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "127.0.0.1:$chief_port,127.0.0.1:$worker_port"
     --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms")
ckpt=$tmp/run
bound=60
ps=("$foreman" train "${model[@]}" "${net[@]}" --job-name ps --task-index 0 --ps-join-timeout-secs "$bound"
    --ps-eviction-grace-secs "$grace" --checkpoint-dir "$tmp/ps_unused")
chief=("$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index 0 --checkpoint-dir "$ckpt"
       --save-checkpoint-steps 1000000 --ps-wait-secs "$bound")
worker1=("$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index 1 --checkpoint-dir "$tmp/unused"
         --ps-wait-secs "$bound")
finish_report() {
  for f in ps ps2; do [[ -e $tmp/$f.out ]] && { echo "--- $f:"; cat "$tmp/$f.out"; }; done
  for f in chief worker1; do
    [[ -e $tmp/$f.out ]] && { echo "--- $f:"; grep -Ev '^step [0-9]+' "$tmp/$f.out" | tail -n 40; }
  done
  failures_summary
  exit 1
}
now() { date +%s.%N; }

"${ps[@]}" >"$tmp/ps.out" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
"${worker1[@]}" >"$tmp/worker1.out" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
"${chief[@]}" >"$tmp/chief.out" 2>&1 &
chief_pid=$!
pids+=("$chief_pid")
wait_for_lines "^step [0-9]+" "$tmp/chief.out" "$bound" 30 "$chief_pid" || fail "the chief trained no 30 steps"
wait_for_lines "^step [0-9]+" "$tmp/worker1.out" "$bound" 5 "$worker_pid" || fail "worker 1 trained no 5 steps"
((failures == 0)) || finish_report

# 1. The ps evicted: the chief's checkpoint, then exit 75.
termed_at=$(now)
kill -TERM "$ps_pid" 2>/dev/null
wait_bounded "$ps_pid" "$((grace + 10))"
exited_at=$(now)
took=$("$py" -c "print(f'{$exited_at - $termed_at:.2f}')")
ps_out=$(cat "$tmp/ps.out")
[[ $rc -eq $stopped ]] || fail "the ps stopped by SIGTERM exited $rc, expected $stopped"
"$py" -c "import sys; sys.exit(0 if $took <= $(scaled $((grace + 2))) else 1)" \
  || fail "the ps took $took s to exit (> --ps-eviction-grace-secs $grace + 2 s)"
has "stopping \(evicted\): the chief read its state for a checkpoint; exiting" "$ps_out" \
  || fail "the ps did not exit on the chief's checkpoint read"
has "^ps task 0: stopped by a signal before training ended, not finished \(exit $stopped\)" "$ps_out" \
  || fail "the ps's last line"
wait_for_line "Checkpoint for the evicted ps task saved at global_step [0-9]+" "$tmp/chief.out" 10 "$chief_pid" \
  || fail "the chief did not take a checkpoint for the evicted ps"
saved=$(sed -n 's/.*Checkpoint for the evicted ps task saved at global_step \([0-9]*\)\..*/\1/p' "$tmp/chief.out" | head -n 1)
[[ -n $saved && -e $ckpt/model.ckpt-$saved.index ]] || fail "no checkpoint model.ckpt-$saved in $ckpt: $(ls "$ckpt")"
((${saved:-0} >= 30)) || fail "the eviction's checkpoint is at step '${saved}', expected >= 30"
has "is stopping \(evicted\)" "$(cat "$tmp/chief.out")" || fail "the chief did not see the ps's refusal"
kill -0 "$chief_pid" 2>/dev/null || fail "the chief exited at the ps's eviction"
kill -0 "$worker_pid" 2>/dev/null || fail "worker 1 exited at the ps's eviction"
((failures == 0)) || finish_report

# 2. The ps again: the chief restores it from that checkpoint, no step lost.
sleep 0.5
"${ps[@]}" >"$tmp/ps2.out" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
wait_for_line "steps lost" "$tmp/chief.out" "$bound" "$chief_pid" || fail "the chief did not recover"
wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
out=$(cat "$tmp/chief.out")
[[ $chief_rc -eq 0 ]] || fail "the chief exited $chief_rc"
[[ $worker_rc -eq 0 ]] || fail "worker 1 exited $worker_rc"
[[ $ps_rc -eq 0 ]] || fail "the restarted ps exited $ps_rc"
has "Restoring parameters from $ckpt/model.ckpt-$saved\b" "$out" || fail "the chief did not restore model.ckpt-$saved"
line=$(grep -E "Recovered from a preemption error \(recovery 1\): global_step [0-9]+ before the error, [0-9]+ restored; [0-9]+ steps lost" <<<"$out")
read -r b r l <<<"$(sed -n 's/.*global_step \([0-9]*\) before the error, \([0-9]*\) restored; \([0-9]*\) steps lost.*/\1 \2 \3/p' <<<"$line")"
[[ ${r:-} == "$saved" && ${l:-} == 0 ]] || fail "the recovery restored '${r:-}' (expected $saved) and lost '${l:-}' steps (expected 0): $line"
has "^recoveries: 1 \(global steps lost: 0\)" "$out" || fail "foreman train did not report 1 recovery losing 0 steps"
final=$(sed -n 's/^training ended at global_step \([0-9]*\)$/\1/p' <<<"$out")
[[ $final =~ ^[0-9]+$ ]] && ((final >= max_steps && final <= max_steps + 20)) \
  || fail "training ended at global_step '${final}', expected --max-steps $max_steps (or a few past it)"
((failures == 0)) || finish_report
echo "ps evicted at checkpoint $saved: exited 75 after $took s; restored with 0 steps lost; training ended at $final"
echo "cluster_ps_evict_test: OK"
