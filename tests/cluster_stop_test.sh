#!/usr/bin/env bash
# `foreman cluster stop` (issue 31 point 1: ending a job early is an
# explicit request, never a side effect of an eviction). Two ps tasks, the
# chief and worker 1 train an asynchronous run with a --max-steps they would not
# reach; `foreman cluster stop tcp://<chief>` ends training on both ps
# tasks at global_step S (each logs that the stop ended it, not the chief's
# own end after its final checkpoint): it prints S, the chief takes its final checkpoint at
# S or a little past it (its own steps in flight), and every task exits 0
# (a finished job, not 75). Then what it refuses: a ps task's address (exit
# 1, naming it), a port nothing listens on (exit 1, within the timeout), a
# malformed address (exit 2); and a second stop of the ended job is
# answered again (idempotent) while the ps still serves.
#
#   cluster_stop_test.sh FOREMAN HEARTBEAT_MS CONNECTION_TIMEOUT_MS
set -u
foreman=$1
heartbeat_ms=$2
timeout_ms=$3
NAME=cluster_stop_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"
bound=120

ports=$(free_ports 5) || { echo "FAIL: cannot find free ports"; exit 1; }
read -r ps_port ps1_port chief_port worker_port dead_port <<<"$ports"
model=(--hidden 16 --batch-size 50 --threads 1 --max-steps 1000000 --epochs 1000 --optimizer adam --seed 7
       --log-step-count-steps 1 --eval-every-steps 0)
net=(--heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms"
     --ps-hosts "127.0.0.1:$ps_port,127.0.0.1:$ps1_port" --worker-hosts "127.0.0.1:$chief_port,127.0.0.1:$worker_port")
"$foreman" train "${model[@]}" "${net[@]}" --job-name ps --task-index 0 --ps-join-timeout-secs "$bound" \
  --checkpoint-dir "$tmp/ps_unused" >"$tmp/ps.out" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
"$foreman" train "${model[@]}" "${net[@]}" --job-name ps --task-index 1 --ps-join-timeout-secs "$bound" \
  --checkpoint-dir "$tmp/ps1_unused" >"$tmp/ps1.out" 2>&1 &
ps1_pid=$!
pids+=("$ps1_pid")
"$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index 0 --checkpoint-dir "$tmp/run" \
  --save-checkpoint-steps 1000000 >"$tmp/chief.out" 2>&1 &
chief_pid=$!
pids+=("$chief_pid")
"$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index 1 --checkpoint-dir "$tmp/unused" \
  --ps-wait-secs "$bound" >"$tmp/worker1.out" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
wait_for_steps "$tmp/chief.out" 20 "$bound" "$chief_pid" || fail "the chief trained no step: $(tail -20 "$tmp/chief.out")"
wait_for_steps "$tmp/worker1.out" 20 "$bound" "$worker_pid" || fail "worker 1 trained no step: $(tail -20 "$tmp/worker1.out")"

# A ps task's address: refused, nothing ended (the run trains on below).
out=$("$foreman" cluster stop "tcp://127.0.0.1:$ps_port" --heartbeat-ms "$heartbeat_ms" \
  --connection-timeout-ms "$timeout_ms" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "cluster stop of the ps's address exited $rc, not 1: $out"
has "tcp://127.0.0.1:$ps_port is ps task 0 of cluster job 'spec-[0-9a-f]{12}': give a worker's address \(the chief's\).*nothing was ended" "$out" \
  || fail "cluster stop of the ps's address did not say why: $out"
# Nothing listens: exit 1 naming the address, within the timeout.
start=$(date +%s%N)
out=$("$foreman" cluster stop "tcp://127.0.0.1:$dead_port" --timeout-ms 1000 2>&1); rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
[[ $rc -eq 1 ]] || fail "cluster stop of a dead port exited $rc, not 1: $out"
has "127\.0\.0\.1:$dead_port.*nothing was ended" "$out" || fail "cluster stop of a dead port did not name it: $out"
((ms <= $(scaled 5000))) || fail "cluster stop of a dead port took $ms ms (timeout 1000 ms)"
out=$("$foreman" cluster stop "127.0.0.1:$chief_port" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "cluster stop of a malformed address exited $rc, not 2: $out"
has "is not a task's address: expected tcp://HOST:PORT" "$out" || fail "cluster stop of a malformed address: $out"
kill -0 "$chief_pid" 2>/dev/null || fail "the chief exited after the refused stops: $(tail -20 "$tmp/chief.out")"

# The stop.
out=$("$foreman" cluster stop "tcp://127.0.0.1:$chief_port" --heartbeat-ms "$heartbeat_ms" \
  --connection-timeout-ms "$timeout_ms" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "cluster stop exited $rc: $out"
stop_step=$(sed -n 's/^ended training of cluster job spec-[0-9a-f]\{12\} at global_step \([0-9]*\) on 2 ps task(s).*/\1/p' <<<"$out")
[[ $stop_step =~ ^[0-9]+$ ]] || fail "cluster stop printed no global_step: $out"
again=$("$foreman" cluster stop "tcp://127.0.0.1:$chief_port" --heartbeat-ms "$heartbeat_ms" \
  --connection-timeout-ms "$timeout_ms" 2>&1); rc=$?
# A second stop finds the job ended (idempotent) or its chief already gone.
[[ $rc -eq 0 ]] || has "nothing was ended" "$again" || fail "a second cluster stop: exit $rc: $again"

wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
wait_bounded "$ps1_pid" "$bound"; ps1_rc=$rc
chief_out=$(cat "$tmp/chief.out")
[[ $chief_rc -eq 0 ]] || fail "the chief exited $chief_rc, not 0 (a finished job): $(tail -20 <<<"$chief_out")"
[[ $worker_rc -eq 0 ]] || fail "worker 1 exited $worker_rc, not 0: $(tail -20 "$tmp/worker1.out")"
[[ $ps_rc -eq 0 ]] || fail "the ps exited $ps_rc, not 0: $(tail -20 "$tmp/ps.out")"
[[ $ps1_rc -eq 0 ]] || fail "ps task 1 exited $ps1_rc, not 0: $(tail -20 "$tmp/ps1.out")"
final=$(sed -n 's/^training ended at global_step \([0-9]*\)$/\1/p' <<<"$chief_out")
[[ $final =~ ^[0-9]+$ && $stop_step =~ ^[0-9]+$ ]] && ((final >= stop_step && final <= stop_step + 5)) \
  || fail "the chief's end of training ($final) is not the stop's global_step $stop_step (or just past it)"
[[ -f $tmp/run/model.ckpt-$final.index ]] || fail "no final checkpoint model.ckpt-$final: $(ls "$tmp/run")"
for w in chief worker1; do
  has "^(worker [01]: )?\`foreman cluster stop\` ended training \(its update was refused: OUT_OF_RANGE\); exiting" \
    "$(cat "$tmp/$w.out")" || fail "$w did not say that \`foreman cluster stop\` ended training: $(tail -8 "$tmp/$w.out")"
done
has "ps task 0: training ended by \`foreman cluster stop\` at global_step $stop_step" \
  "$(cat "$tmp/ps.out")" || fail "the ps did not log that \`foreman cluster stop\` ended training: $(tail -8 "$tmp/ps.out")"
# ps task 1 too: ended by the stop (given ps 0's global_step), not left to the chief's own end of training.
has "ps task 1: training ended by \`foreman cluster stop\` at global_step $stop_step" \
  "$(cat "$tmp/ps1.out")" || fail "ps task 1 was not ended by \`foreman cluster stop\`: $(tail -8 "$tmp/ps1.out")"

if ((failures > 0)); then
  for f in ps ps1 chief worker1; do echo "--- $f:"; tail -n 30 "$tmp/$f.out"; done
  failures_summary
  exit 1
fi
echo "cluster stop ended the job at global_step $stop_step; the chief's final checkpoint at $final; all exited 0"
echo "cluster_stop_test: OK"
