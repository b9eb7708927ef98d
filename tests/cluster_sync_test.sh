#!/usr/bin/env bash
# Synchronous training in `foreman train` (issue 13 points 2 and 7; TF's
# SyncReplicasOptimizer): a ps, the chief (worker 0) and worker 1 on
# 127.0.0.1, every task started with --replicas-to-aggregate 2, train a small
# MLP for --max-steps 12. Each update on the ps averages both workers'
# gradients of one step, so global_step advances once per pair: the run
# ends at global_step 12 exactly (the chief's final checkpoint is
# model.ckpt-12), each worker trained 12 steps, and the ps's end-of-training
# line says 12 aggregated updates of 24 gradients, 2 to 2 per update, no
# stale gradient (nothing made one). Everything exits 0. Bad sync flags
# are exit 2 naming the flag, before anything is created. The stale-gradient
# drop and the replacement of a worker's timed-out apply are asserted in
# tests/cluster_server_test.cpp (they need a gradient injected on purpose).
# Then rule 4: with worker 1 killed, the chief's waits are bounded
# (--operation-timeout-ms 300) and it exits 1 naming the wait.
#
#   cluster_sync_test.sh FOREMAN HEARTBEAT_MS CONNECTION_TIMEOUT_MS
set -u
foreman=$1
heartbeat_ms=$2
timeout_ms=$3
NAME=cluster_sync_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"

ports=$(free_ports 3) || { echo "FAIL: cannot find free ports"; exit 1; }
read -r ps_port chief_port worker_port <<<"$ports"

steps=12
model=(--hidden 16 --batch-size 50 --threads 1 --max-steps "$steps" --optimizer adam --seed 7
       --log-step-count-steps 1 --eval-every-steps 0)
net=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "127.0.0.1:$chief_port,127.0.0.1:$worker_port"
     --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms")
sync=(--replicas-to-aggregate 2)
ckpt=$tmp/run
bound=120

# 1. Bad sync flags: exit 2 naming the flag, before anything is created.
refused() {  # refused EXPECTED_REGEX FLAGS...
  local want=$1 out code
  shift
  out=$(timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}" "$@" 2>&1); code=$?
  [[ $code -eq 2 ]] || fail "'$*' exited $code, expected 2: $out"
  has "$want" "$out" || fail "'$*' does not say '$want': $out"
}
refused "--replicas-to-aggregate=3 is more than the 2 workers" "${net[@]}" --job-name worker --task-index 0 \
  --replicas-to-aggregate 3
refused "--replicas-to-aggregate=2 is more than --total-num-replicas=1" "${net[@]}" --job-name ps --task-index 0 \
  --replicas-to-aggregate 2 --total-num-replicas 1
refused "--total-num-replicas=3 is more than the 2 workers" "${net[@]}" --job-name worker --task-index 1 \
  --replicas-to-aggregate 1 --total-num-replicas 3
refused "--replicas-to-aggregate must be >= 1" "${net[@]}" --job-name worker --task-index 0 \
  --replicas-to-aggregate 0
refused "--total-num-replicas is for synchronous training" "${net[@]}" --job-name worker --task-index 0 \
  --total-num-replicas 2
refused "--replicas-to-aggregate is a cluster flag" --replicas-to-aggregate 1
refused "--operation-timeout-ms must be > 0, got 0" "${net[@]}" --job-name worker --task-index 0 \
  --operation-timeout-ms 0
[[ ! -e $tmp/bad ]] || fail "a refused start created its --checkpoint-dir"

# 2. The cluster: worker 1 first, then the chief once worker 1 waits.
"$foreman" train "${model[@]}" "${net[@]}" "${sync[@]}" --job-name ps --task-index 0 \
  --ps-join-timeout-secs "$bound" --checkpoint-dir "$tmp/ps_unused" >"$tmp/ps.out" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
"$foreman" train "${model[@]}" "${net[@]}" "${sync[@]}" --job-name worker --task-index 1 \
  --checkpoint-dir "$tmp/unused" --ps-wait-secs "$bound" >"$tmp/worker1.out" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
wait_for_line "^foreman train: worker 1 of 2" "$tmp/worker1.out" "$bound" "$worker_pid" \
  || fail "worker 1 did not start: $(cat "$tmp/worker1.out")"
"$foreman" train "${model[@]}" "${net[@]}" "${sync[@]}" --job-name worker --task-index 0 \
  --checkpoint-dir "$ckpt" --save-checkpoint-secs 600 >"$tmp/chief.out" 2>&1 &
chief_pid=$!
pids+=("$chief_pid")
wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
chief_out=$(cat "$tmp/chief.out")
worker_out=$(cat "$tmp/worker1.out")
ps_out=$(cat "$tmp/ps.out")
[[ $chief_rc -eq 0 ]] || fail "the chief exited $chief_rc"
[[ $worker_rc -eq 0 ]] || fail "worker 1 exited $worker_rc"
[[ $ps_rc -eq 0 ]] || fail "the ps exited $ps_rc"

k0=$(sed -n 's/^worker 0: trained \([0-9]*\) steps.*/\1/p' <<<"$chief_out")
k1=$(sed -n 's/^worker 1: trained \([0-9]*\) steps.*/\1/p' <<<"$worker_out")
final=$(sed -n 's/^training ended at global_step \([0-9]*\)$/\1/p' <<<"$chief_out")
echo "worker 0: $k0 steps, worker 1: $k1 steps, training ended at global_step $final"
[[ $final == "$steps" ]] || fail "training ended at global_step '$final', expected $steps"
[[ $k0 == "$steps" ]] || fail "the chief trained '$k0' steps, expected $steps (one per aggregated update)"
[[ $k1 == "$steps" ]] || fail "worker 1 trained '$k1' steps, expected $steps (one per aggregated update)"
has "^checkpoints: $ckpt \(latest: $ckpt/model.ckpt-$steps\)" "$chief_out" \
  || fail "the chief's latest checkpoint is not model.ckpt-$steps"
[[ -f $ckpt/model.ckpt-$steps.index ]] || fail "no $ckpt/model.ckpt-$steps.index"
has "^foreman train: synchronous training: each update averages 2 of the 2 workers' gradients" "$chief_out" \
  || fail "the chief does not say it trains synchronously"
want="ps task 0: synchronous training \(--replicas-to-aggregate 2\) ended at step $steps: $steps aggregated updates of $((2 * steps)) gradients \(2 to 2 per update\), 0 stale gradients dropped"
has "$want" "$ps_out" || fail "the ps's end-of-training line is not '$want'"

# 3. Rule 4 (never a silent stall): worker 1 killed (-9) while the chief
#    trains with --operation-timeout-ms 300: each of the chief's applies
#    waits for worker 1's gradients at most 300 ms (UNAVAILABLE naming the
#    wait), its recovery runs the step again, and once its 10 recoveries
#    are spent it exits 1 saying why (TF1 would wait forever).
ports=$(free_ports 3) || { echo "FAIL: cannot find free ports"; exit 1; }
read -r ps_port chief_port worker_port <<<"$ports"
net=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "127.0.0.1:$chief_port,127.0.0.1:$worker_port"
     --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms" --operation-timeout-ms 300)
long=(--max-steps 1000000 --epochs 1000)
"$foreman" train "${model[@]}" "${long[@]}" "${net[@]}" "${sync[@]}" --job-name ps --task-index 0 \
  --ps-join-timeout-secs "$bound" --checkpoint-dir "$tmp/ps_unused" >"$tmp/ps2.out" 2>&1 &
ps2_pid=$!
pids+=("$ps2_pid")
"$foreman" train "${model[@]}" "${long[@]}" "${net[@]}" "${sync[@]}" --job-name worker --task-index 1 \
  --checkpoint-dir "$tmp/unused" >"$tmp/worker1b.out" 2>&1 &
worker2_pid=$!
pids+=("$worker2_pid")
"$foreman" train "${model[@]}" "${long[@]}" "${net[@]}" "${sync[@]}" --job-name worker --task-index 0 \
  --checkpoint-dir "$tmp/run2" >"$tmp/chief2.out" 2>&1 &
chief2_pid=$!
pids+=("$chief2_pid")
wait_for_lines "^step [0-9]+" "$tmp/chief2.out" "$bound" 3 "$chief2_pid" || fail "the second chief trained no step"
kill -9 "$worker2_pid" 2>/dev/null
killed_at=$(date +%s%N)
wait_bounded "$chief2_pid" 60; chief2_rc=$rc
took_ms=$((($(date +%s%N) - killed_at) / 1000000))
chief2_out=$(cat "$tmp/chief2.out")
echo "worker 1 killed: the chief exited $chief2_rc after $took_ms ms"
[[ $chief2_rc -eq 1 ]] || fail "the chief exited $chief2_rc with fewer than 2 workers alive, expected 1"
has "^foreman train: training failed: ps task 0 \(127.0.0.1:$ps_port\): no answer within 300 ms \(request_timeout_ms\); in synchronous mode an apply waits for 2 workers' applies of its step" \
  "$chief2_out" || fail "the chief's failure does not name the synchronous wait"
has "Giving up after 10 recoveries" "$chief2_out" || fail "the chief did not spend its bounded recoveries"
kill -TERM "$ps2_pid" 2>/dev/null
wait_bounded "$ps2_pid" 30

if ((failures > 0)); then
  echo "--- ps (3):"; cat "$tmp/ps2.out"; echo "--- chief (3):"; echo "$chief2_out" | grep -v "^step" | tail -40
  echo "--- ps:"; echo "$ps_out"; echo "--- chief:"; echo "$chief_out"; echo "--- worker 1:"; echo "$worker_out"
  failures_summary
  exit 1
fi
echo "cluster_sync_test: OK"
