#!/usr/bin/env bash
# A cluster's identity and its deaths logged (issue 31 points 3 and 4).
#
# 1. The second chief (point 3): job A (a ps, the chief and worker 1)
#    trains to --max-steps MAX_STEPS. While it trains, job B's chief is
#    started with A's ps address in a spec of its own (a copy-pasted
#    --ps-hosts: its job id, derived from its spec, differs), and then once
#    more with A's spec but an explicit --cluster-job-id. Each is refused:
#    exit 2, the message naming FAILED_PRECONDITION's cause with both job
#    ids; A's ps logs the refusal. A is untouched: its global_step never
#    goes back, it ends training at >= MAX_STEPS (not at B's), and every
#    task of A exits 0. `foreman cluster status` shows A's job id on every
#    task. (Before the job ids, B's chief re-initialised A's ps and ended
#    training on it at its own --max-steps, and exited 0.)
# 2. Deaths are logged (point 4), in a run ended by a SIGTERM to the chief
#    (--signal-ends-training): worker 1 starts 2 s before the chief and
#    waits for it: "Waiting for model to be ready" is logged at most twice
#    (not every --heartbeat-ms). kill -9 worker 1: the chief logs "worker 1
#    (/job:worker/task:1) lost" once (counted 3 s after the first); worker
#    1 started again: the chief logs its return once. kill -9 the chief:
#    the ps and worker 1 each log "the chief (/job:worker/task:0) lost"
#    once; the chief started again with its --checkpoint-dir emptied (it
#    re-attaches: point 3, no init op on an initialised ps of its job, no
#    global step lost): each logs its return once.
#
#   cluster_identity_test.sh FOREMAN HEARTBEAT_MS CONNECTION_TIMEOUT_MS MAX_STEPS
set -u
foreman=$1
heartbeat_ms=$2
timeout_ms=$3
max_steps=$4
NAME=cluster_identity_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"
bound=120

count() {
  local c
  c=$(grep -Ec -- "$1" "$2" 2>/dev/null)
  echo "${c:-0}"
}

# -- 1. the second chief -------------------------------------------------------------
ports=$(free_ports 4) || { echo "FAIL: cannot find free ports"; exit 1; }
read -r ps_port chief_port worker_port b_port <<<"$ports"
model=(--hidden 32 --batch-size 50 --threads 1 --max-steps "$max_steps" --optimizer adam --seed 7
       --log-step-count-steps 1 --eval-every-steps 0)
net=(--heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms")
spec_a=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "127.0.0.1:$chief_port,127.0.0.1:$worker_port")
"$foreman" train "${model[@]}" "${net[@]}" "${spec_a[@]}" --job-name ps --task-index 0 \
  --ps-join-timeout-secs "$bound" --checkpoint-dir "$tmp/ps_unused" >"$tmp/ps.out" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
"$foreman" train "${model[@]}" "${net[@]}" "${spec_a[@]}" --job-name worker --task-index 0 \
  --checkpoint-dir "$tmp/a" --save-checkpoint-steps 100 >"$tmp/chief.out" 2>&1 &
chief_pid=$!
pids+=("$chief_pid")
"$foreman" train "${model[@]}" "${net[@]}" "${spec_a[@]}" --job-name worker --task-index 1 \
  --checkpoint-dir "$tmp/unused" --ps-wait-secs "$bound" >"$tmp/worker1.out" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
wait_for_steps "$tmp/chief.out" 5 "$bound" "$chief_pid" || fail "job A's chief trained no step: $(cat "$tmp/chief.out")"
# worker 1 listening too (its Server starts before its first step), so
# that `cluster status` reaches all three tasks.
wait_for_steps "$tmp/worker1.out" 1 "$bound" "$worker_pid" || fail "job A's worker 1 trained no step: $(cat "$tmp/worker1.out")"

status=$("$foreman" cluster status "tcp://127.0.0.1:$chief_port" --timeout-ms 5000 2>&1)
a_id=$(sed -n 's/.*  job \(spec-[0-9a-f]\{12\}\).*/\1/p' <<<"$status" | head -n 1)
[[ -n $a_id ]] || fail "cluster status shows no job id: $status"
[[ $(grep -c "  job $a_id" <<<"$status") -eq 3 ]] || fail "cluster status does not show job $a_id on all 3 tasks: $status"

# B's chief, twice: its own spec with A's ps (a derived id of its own), and
# A's ps with an explicit id. --max-steps 50: B would end A early.
b_model=(--hidden 32 --batch-size 50 --threads 1 --max-steps 50 --optimizer adam --seed 8
         --log-step-count-steps 1 --eval-every-steps 0)
b_tries=("--ps-hosts 127.0.0.1:$ps_port --worker-hosts 127.0.0.1:$b_port"
         "--ps-hosts 127.0.0.1:$ps_port --worker-hosts 127.0.0.1:$b_port --cluster-job-id job-b")
b=0
for flags in "${b_tries[@]}"; do
  b=$((b + 1))
  # shellcheck disable=SC2086
  "$foreman" train "${b_model[@]}" "${net[@]}" $flags --job-name worker --task-index 0 \
    --checkpoint-dir "$tmp/b$b" --ps-wait-secs 10 >"$tmp/b$b.out" 2>&1 &
  b_pid=$!
  pids+=("$b_pid")
  wait_bounded "$b_pid" 60
  b_out=$(cat "$tmp/b$b.out")
  [[ $rc -eq 2 ]] || fail "job B's chief ($flags) exited $rc, not 2: $b_out"
  kill -0 "$chief_pid" 2>/dev/null || fail "job A's chief had already exited when B's chief $b was done: MAX_STEPS too small?"
  b_id=job-b
  ((b == 1)) && b_id=$(sed -n 's/.*(cluster job \(spec-[0-9a-f]\{12\}\)).*/\1/p' <<<"$b_out" | head -n 1)
  [[ -n $b_id && $b_id != "$a_id" ]] || fail "job B's chief $b logs no job id of its own (A's: $a_id): $b_out"
  has "ps task 0 serves cluster job '$a_id' and refused the init \(or restore\) of cluster job '$b_id'" "$b_out" \
    || fail "job B's chief $b was not refused naming both ids ($a_id, $b_id): $b_out"
  has "refused the init \(or restore\) of cluster job '$b_id'" "$(cat "$tmp/ps.out")" \
    || fail "A's ps did not log refusing B's chief $b: $(cat "$tmp/ps.out")"
done

wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
chief_out=$(cat "$tmp/chief.out")
[[ $chief_rc -eq 0 ]] || fail "job A's chief exited $chief_rc: $chief_out"
[[ $worker_rc -eq 0 ]] || fail "job A's worker 1 exited $worker_rc: $(cat "$tmp/worker1.out")"
[[ $ps_rc -eq 0 ]] || fail "job A's ps exited $ps_rc: $(cat "$tmp/ps.out")"
final=$(sed -n 's/^training ended at global_step \([0-9]*\)$/\1/p' <<<"$chief_out")
[[ $final =~ ^[0-9]+$ ]] && ((final >= max_steps)) \
  || fail "job A's chief did not end training at >= --max-steps $max_steps (at '$final'): $chief_out"
printed=$(sed -n 's/^step \([0-9]*\).*/\1/p' <<<"$chief_out")
sort -n -c <<<"$printed" 2>/dev/null || fail "job A's global_step went back: $(tr '\n' ' ' <<<"$printed" | head -c 2000)"
echo "job A ($a_id) ended training at global_step $final; B's chiefs refused"

# -- 2. deaths logged ------------------------------------------------------------------
ports=$(free_ports 3) || { echo "FAIL: cannot find free ports"; exit 1; }
read -r ps_port chief_port worker_port <<<"$ports"
# --epochs 1000: never the end here (the default 15 epochs are 18000 steps,
# which a fast machine's cluster trains before the chief's restart).
model=(--hidden 32 --batch-size 50 --threads 1 --max-steps 1000000 --epochs 1000 --optimizer adam --seed 7
       --log-step-count-steps 1 --eval-every-steps 0)
net+=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "127.0.0.1:$chief_port,127.0.0.1:$worker_port")
chief=("$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index 0 --checkpoint-dir "$tmp/d"
       --save-checkpoint-steps 20 --signal-ends-training)
worker=("$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index 1 --checkpoint-dir "$tmp/unused2"
        --ps-wait-secs "$bound")
"$foreman" train "${model[@]}" "${net[@]}" --job-name ps --task-index 0 --ps-join-timeout-secs "$bound" \
  --checkpoint-dir "$tmp/ps_unused2" >"$tmp/ps2.out" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
"${worker[@]}" >"$tmp/w1a.out" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
wait_for_line "Waiting for model to be ready" "$tmp/w1a.out" "$bound" "$worker_pid" \
  || fail "worker 1 did not wait for the chief: $(cat "$tmp/w1a.out")"
sleep 2  # at --heartbeat-ms, 10 polls or more
"${chief[@]}" >"$tmp/c1.out" 2>&1 &
chief_pid=$!
pids+=("$chief_pid")
wait_for_steps "$tmp/w1a.out" 5 "$bound" "$worker_pid" || fail "worker 1 trained no step: $(cat "$tmp/w1a.out")"
waits=$(count "Waiting for model to be ready" "$tmp/w1a.out")
((waits >= 1 && waits <= 2)) || fail "worker 1 logged 'Waiting for model to be ready' $waits times in ~2 s (at most 2)"

lost1="worker 1 \(/job:worker/task:1\) lost: no update from it for [0-9]+ ms"
back1="worker 1 \(/job:worker/task:1\) returned: updating again after [0-9]+ ms"
lost0="the chief \(/job:worker/task:0\) lost: no update from it for [0-9]+ ms"
back0="the chief \(/job:worker/task:0\) returned: updating again after [0-9]+ ms"
kill -9 "$worker_pid"
wait_bounded "$worker_pid" "$bound"
wait_for_line "$lost1" "$tmp/c1.out" 20 "$chief_pid" || fail "the chief did not log worker 1 lost: $(cat "$tmp/c1.out")"
sleep 3
n=$(count "$lost1" "$tmp/c1.out")
[[ $n -eq 1 ]] || fail "the chief logged worker 1 lost $n times (want 1)"
"${worker[@]}" >"$tmp/w1b.out" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
wait_for_line "$back1" "$tmp/c1.out" 60 "$chief_pid" || fail "the chief did not log worker 1's return: $(cat "$tmp/c1.out")"
sleep 2
n=$(count "$back1" "$tmp/c1.out")
[[ $n -eq 1 ]] || fail "the chief logged worker 1's return $n times (want 1)"
n=$(count "$lost1" "$tmp/c1.out")
[[ $n -eq 1 ]] || fail "the chief logged worker 1 lost $n times after its return (want 1)"

kill -9 "$chief_pid"
wait_bounded "$chief_pid" "$bound"
wait_for_line "$lost0" "$tmp/ps2.out" 20 "$ps_pid" || fail "the ps did not log the chief lost: $(cat "$tmp/ps2.out")"
wait_for_line "$lost0" "$tmp/w1b.out" 20 "$worker_pid" || fail "worker 1 did not log the chief lost: $(cat "$tmp/w1b.out")"
sleep 3
for f in ps2 w1b; do
  n=$(count "$lost0" "$tmp/$f.out")
  [[ $n -eq 1 ]] || fail "$f logged the chief lost $n times (want 1)"
done
# The chief comes back without its checkpoints (an emptied --checkpoint-dir:
# a pod rescheduled without its volume): it re-attaches to the ps instead of
# running the init op, which would wipe the job (point 3; TF1 runs it).
c1_last=$(sed -n 's/^step \([0-9]*\).*/\1/p' "$tmp/c1.out" | tail -n 1)
rm -rf "$tmp/d"
"${chief[@]}" >"$tmp/c2.out" 2>&1 &
chief_pid=$!
pids+=("$chief_pid")
wait_for_line "$back0" "$tmp/ps2.out" 60 "$ps_pid" || fail "the ps did not log the chief's return: $(cat "$tmp/ps2.out")"
wait_for_line "$back0" "$tmp/w1b.out" 60 "$worker_pid" || fail "worker 1 did not log the chief's return: $(cat "$tmp/w1b.out")"
sleep 2
for f in ps2 w1b; do
  n=$(count "$back0" "$tmp/$f.out")
  [[ $n -eq 1 ]] || fail "$f logged the chief's return $n times (want 1)"
done
wait_for_steps "$tmp/c2.out" 2 "$bound" "$chief_pid" || fail "the restarted chief trained no step: $(cat "$tmp/c2.out")"
has "No checkpoint to restore in $tmp/d, but the ps tasks hold the variables of cluster job 'spec-[0-9a-f]{12}' \\(global_step [0-9]+\\): re-attaching" \
  "$(cat "$tmp/c2.out")" || fail "the chief with an emptied --checkpoint-dir did not re-attach: $(head -c 3000 "$tmp/c2.out")"
c2_first=$(sed -n 's/^step \([0-9]*\).*/\1/p' "$tmp/c2.out" | head -n 1)
[[ $c1_last =~ ^[0-9]+$ && $c2_first =~ ^[0-9]+$ ]] && ((c2_first >= c1_last)) \
  || fail "the chief with an emptied --checkpoint-dir went back: its first step $c2_first, the first chief's last $c1_last"
kill -TERM "$chief_pid" 2>/dev/null
wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
[[ $chief_rc -eq 0 ]] || fail "the restarted chief exited $chief_rc: $(cat "$tmp/c2.out")"
[[ $worker_rc -eq 0 ]] || fail "worker 1 exited $worker_rc: $(cat "$tmp/w1b.out")"
[[ $ps_rc -eq 0 ]] || fail "the ps exited $ps_rc: $(cat "$tmp/ps2.out")"
for f in ps2 w1b c2; do
  n=$(grep -Ec "(lost|returned): " "$tmp/$f.out")
  echo "$f: $n lost/returned lines: $(grep -E "(lost|returned): " "$tmp/$f.out" | sed 's/^.*\] //' | tr '\n' '|')"
done

if ((failures > 0)); then
  for f in ps chief worker1 b1 b2 ps2 w1a c1 w1b c2; do
    [[ -f $tmp/$f.out ]] || continue
    echo "--- $f:"; tail -n 40 "$tmp/$f.out"
  done
  failures_summary
  exit 1
fi
echo "cluster_identity_test: OK"
