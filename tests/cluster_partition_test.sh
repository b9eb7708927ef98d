#!/usr/bin/env bash
# A network partition of one node (issue 13 point 4: "behaves as that node's
# death on the other side, and rejoins when healed"), in network namespaces
# this script creates itself (`unshare -rn`: an unprivileged user + network
# namespace, nothing outside it is reachable or touched):
#   namespace A (this script's): 10.213.0.1 on veth fa
#   namespace B (a child, held by a `sleep` this script starts): 10.213.0.2
#                on veth fb, the other end of the pair
# The partitioned task runs in B, the others in A. The cut is silent in both
# directions, as a pulled cable: each side's neighbour entry for the other
# is replaced by a MAC address nobody has (`ip neigh replace ... nud
# permanent`), so frames still leave but the peer's device drops them; no
# RST, no ICMP, the links stay up. Healing deletes the two entries. (This
# machine's kernel has no netem/prio qdiscs and no iptables/nft.) Every task
# gets --insecure: the cluster's addresses are the veth pair's, not loopback.
#   worker: cut worker 1 (not the chief) mid-run -> the chief trains on as
#           after a worker's death; worker 1 sees the ps lost after about the
#           connection timeout and waits for it (--ps-wait-secs); healed,
#           worker 1 continues from the ps's current values (its first step
#           after the heal is past the chief's step at the heal); all exit 0.
#   ps:     cut the ps mid-run (past the chief's first checkpoint) -> both
#           workers see it lost after about the connection timeout and wait
#           for it as for a killed ps; healed, the chief's recovery restores
#           or re-attaches (the ps kept its state: cluster.md's failure
#           table), logs it, and both workers train again; all exit 0.
# Exits 77 (meson's skip) where user/network namespaces, `ip` or `nsenter`
# are not available. Every wait is bounded; the trap kills only the
# processes this script started.
#
#   cluster_partition_test.sh FOREMAN TOOLS_TESTING_DIR HEARTBEAT_MS CONNECTION_TIMEOUT_MS [CASES]
# CASES: a comma list of worker,ps (default: both).
set -u
if [[ -z ${FOREMAN_PARTITION_NS:-} ]]; then
  for t in unshare nsenter ip; do
    command -v "$t" >/dev/null || { echo "SKIP: '$t' is not installed (util-linux, iproute2)"; exit 77; }
  done
  unshare -rn ip link set lo up 2>/dev/null \
    || { echo "SKIP: cannot create a user + network namespace here (unshare -rn; see kernel.unprivileged_userns_clone)"; exit 77; }
  FOREMAN_PARTITION_NS=1 exec unshare -rn bash "$0" "$@"
fi
foreman=$1
tools=$2
heartbeat_ms=$3
timeout_ms=$4
cases=${5:-worker,ps}
NAME=cluster_partition_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"

bound=60
a=10.213.0.1
b=10.213.0.2
model=(--hidden 16 --batch-size 50 --threads 1 --max-steps 1000000 --epochs 1000 --optimizer adam --seed 7
       --log-step-count-steps 1 --eval-every-steps 0)

# Namespace B and the veth pair.
setup_error() { echo "SKIP: cannot set up the namespaces' veth pair: $*"; exit 77; }
ip link set lo up || setup_error "ip link set lo up"
ip link add fa type veth peer name fb || setup_error "ip link add (veth)"
unshare -n sleep $((8 * bound)) &
holder=$!
pids+=("$holder")
for ((i = 0; i < 100; i++)); do
  [[ $(readlink "/proc/$holder/ns/net") != "$(readlink /proc/self/ns/net)" ]] && break
  sleep 0.02
done
inb() { nsenter -t "$holder" -n "$@"; }
ip link set fb netns "$holder" || setup_error "ip link set fb netns"
ip addr add "$a/24" dev fa && ip link set fa up || setup_error "namespace A's address"
inb ip link set lo up && inb ip addr add "$b/24" dev fb && inb ip link set fb up || setup_error "namespace B's address"

# The partition: silent both ways (see above).
cut() {
  ip neigh replace "$b" lladdr 02:00:00:00:13:02 dev fa nud permanent || fail "cut: namespace A's neighbour entry"
  inb ip neigh replace "$a" lladdr 02:00:00:00:13:01 dev fb nud permanent || fail "cut: namespace B's neighbour entry"
}
heal() {
  ip neigh del "$b" dev fa || fail "heal: namespace A's neighbour entry"
  inb ip neigh del "$a" dev fb || fail "heal: namespace B's neighbour entry"
}
# The pair carries TCP before the cluster starts: a listener in B, a client
# in A (a clear skip, not a cluster failure, where it does not).
inb "$py" -c '
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 7000)); s.listen(); s.settimeout(10)
c, _ = s.accept(); c.sendall(b"ok")' "$b" &
probe=$!
pids+=("$probe")
"$py" -c '
import socket, sys, time
for _ in range(100):
    try:
        print(socket.create_connection((sys.argv[1], 7000), timeout=2).recv(2).decode()); break
    except ConnectionRefusedError: time.sleep(0.05)' "$b" | grep -q ok \
  || setup_error "no TCP connection from $a to $b"
wait "$probe" 2>/dev/null

# $1 = ns (A or B), $2 = output file, then foreman train's flags. Sets $started.
start_task() {
  local ns=$1 out=$2
  shift 2
  if [[ $ns == B ]]; then
    inb "$foreman" train "${model[@]}" "${net[@]}" --insecure "$@" >"$tmp/$out" 2>&1 &
  else
    "$foreman" train "${model[@]}" "${net[@]}" --insecure "$@" >"$tmp/$out" 2>&1 &
  fi
  started=$!
  pids+=("$started")
}
# Starts case $1's cluster: ps in namespace $2, worker 1 in $3, chief in A,
# on ports $4, $4 + 1, $4 + 2 (the namespaces are new: nothing else listens).
# Outputs $tmp/$1.{ps,worker1,chief}.out; chief's checkpoints every 20 steps.
start_cluster() {
  local name=$1 ps_ns=$2 w_ns=$3 port=$4
  ip_of() { [[ $1 == B ]] && echo "$b" || echo "$a"; }
  net=(--ps-hosts "$(ip_of "$ps_ns"):$port" --worker-hosts "$a:$((port + 1)),$(ip_of "$w_ns"):$((port + 2))"
       --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms")
  start_task "$ps_ns" "$name.ps.out" --job-name ps --task-index 0 --ps-join-timeout-secs "$bound" \
    --checkpoint-dir "$tmp/ps_unused"
  ps_pid=$started
  start_task "$w_ns" "$name.worker1.out" --job-name worker --task-index 1 --checkpoint-dir "$tmp/unused" \
    --ps-wait-secs "$bound"
  worker_pid=$started
  wait_for_line "^foreman train: worker 1 of 2" "$tmp/$name.worker1.out" "$bound" "$worker_pid" \
    || fail "$name: worker 1 did not start: $(cat "$tmp/$name.worker1.out")"
  start_task A "$name.chief.out" --job-name worker --task-index 0 --checkpoint-dir "$tmp/$name.ckpt" \
    --save-checkpoint-steps 20 --ps-wait-secs "$bound" --signal-ends-training
  chief_pid=$started
}
finish() {
  kill -TERM "$chief_pid" 2>/dev/null
  wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
  wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
  wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
}
now() { date +%s.%N; }
secs_since() { "$py" -c "import sys; print(f'{$(now) - $1:.2f}')"; }
last_step() { sed -n 's/^step \([0-9]*\).*/\1/p' "$1" | tail -1; }
# Waits for "Recovery: waiting" in $tmp/$1 (task $2 the pid): the task saw
# the ps lost. Sets $took (s since $cut_at).
wait_ps_lost() {
  took=
  if wait_for_line "Recovery: waiting up to $bound s for the ps tasks" "$tmp/$1" "$bound" "$2"; then
    took=$(secs_since "$cut_at")
  else
    fail "$1: did not see the ps lost after the cut: $(tail -20 "$tmp/$1")"
  fi
}
# Detection bound: the connection timeout plus 4 s of slack (1.1-1.2 s
# measured with 1000 ms; the values are printed). It catches a detection
# that waits out the 10 s request timeout instead (a recovery that read
# global_step from the lost ps took 11 s here).
detect_bound=$(scaled $(((timeout_ms + 999) / 1000 + 4)))

# (a) worker 1 cut off.
if [[ ,$cases, == *,worker,* ]]; then
  start_cluster worker A B 7010
  wait_for_line "^step [0-9]+" "$tmp/worker.chief.out" "$bound" "$chief_pid" || fail "worker: the chief trained no step"
  wait_for_line "^step [0-9]+" "$tmp/worker.worker1.out" "$bound" "$worker_pid" || fail "worker: worker 1 trained no step"
  cut; cut_at=$(now)
  n=$(steps_in "$tmp/worker.chief.out")
  wait_ps_lost worker.worker1.out "$worker_pid"; w_took=$took
  wait_for_lines "^step [0-9]+" "$tmp/worker.chief.out" "$bound" $((n + 30)) "$chief_pid" \
    || fail "worker: the chief did not train 30 more steps while worker 1 was cut off"
  [[ -n $w_took ]] && ! "$py" -c "import sys; sys.exit(0 if $w_took <= $detect_bound else 1)" \
    && fail "worker: worker 1 saw the ps lost $w_took s after the cut (> $detect_bound s)"
  m=$(steps_in "$tmp/worker.worker1.out")
  heal
  last=$(last_step "$tmp/worker.chief.out")
  healed_at=$(now)
  wait_for_lines "^step [0-9]+" "$tmp/worker.worker1.out" "$bound" $((m + 3)) "$worker_pid" \
    || fail "worker: worker 1 did not train again after the heal: $(tail -20 "$tmp/worker.worker1.out")"
  rejoined=$(secs_since "$healed_at")
  first=$(sed -n 's/^step \([0-9]*\).*/\1/p' "$tmp/worker.worker1.out" | sed -n "$((m + 1))p")
  [[ $first =~ ^[0-9]+$ && $last =~ ^[0-9]+$ ]] && ((first > last)) \
    || fail "worker: worker 1's first step after the heal ${first:-none} is not past the chief's step ${last:-none} at the heal"
  finish
  out=$(cat "$tmp/worker.chief.out")
  [[ $chief_rc -eq 0 ]] || fail "worker: the chief exited $chief_rc: $(tail -20 <<<"$out")"
  [[ $worker_rc -eq 0 ]] || fail "worker: worker 1 exited $worker_rc: $(tail -20 "$tmp/worker.worker1.out")"
  [[ $ps_rc -eq 0 ]] || fail "worker: the ps exited $ps_rc: $(tail -20 "$tmp/worker.ps.out")"
  ! has "recoveries: " "$out" || fail "worker: the chief recovered from worker 1's partition: $out"
  echo "worker: worker 1 saw the ps lost ${w_took:-?} s after the cut (connection timeout $timeout_ms ms);" \
       "healed, it trained again within $rejoined s, from step $first (the chief was at $last)"
fi

# (b) the ps cut off.
if [[ ,$cases, == *,ps,* ]]; then
  start_cluster ps B A 7020
  wait_for_line "^step (2[1-9]|[3-9][0-9]|[0-9]{3,})\b" "$tmp/ps.chief.out" "$bound" "$chief_pid" \
    || fail "ps: the chief did not pass step 20"
  wait_for_line "^step [0-9]+" "$tmp/ps.worker1.out" "$bound" "$worker_pid" || fail "ps: worker 1 trained no step"
  cut; cut_at=$(now)
  wait_ps_lost ps.chief.out "$chief_pid"; c_took=$took
  wait_ps_lost ps.worker1.out "$worker_pid"; w_took=$took
  for t in "$c_took" "$w_took"; do
    [[ -n $t ]] && ! "$py" -c "import sys; sys.exit(0 if $t <= $detect_bound else 1)" \
      && fail "ps: a worker saw the ps lost $t s after the cut (> $detect_bound s)"
  done
  n0=$(steps_in "$tmp/ps.chief.out"); n1=$(steps_in "$tmp/ps.worker1.out")
  sleep 1  # the partition lasts on purpose: a second of waiting for the ps
  [[ $(steps_in "$tmp/ps.chief.out") -eq $n0 ]] || fail "ps: the chief trained while the ps was cut off"
  heal; healed_at=$(now)
  wait_for_line "Recovered from a preemption error|re-attached to the ps" "$tmp/ps.chief.out" "$bound" "$chief_pid" \
    || fail "ps: the chief did not recover after the heal: $(tail -30 "$tmp/ps.chief.out")"
  recovered=$(secs_since "$healed_at")
  wait_for_lines "^step [0-9]+" "$tmp/ps.chief.out" "$bound" $((n0 + 10)) "$chief_pid" \
    || fail "ps: the chief did not train 10 steps after the heal"
  wait_for_lines "^step [0-9]+" "$tmp/ps.worker1.out" "$bound" $((n1 + 5)) "$worker_pid" \
    || fail "ps: worker 1 did not train again after the heal"
  finish
  out=$(cat "$tmp/ps.chief.out")
  [[ $chief_rc -eq 0 ]] || fail "ps: the chief exited $chief_rc: $(tail -20 <<<"$out")"
  [[ $worker_rc -eq 0 ]] || fail "ps: worker 1 exited $worker_rc: $(tail -20 "$tmp/ps.worker1.out")"
  [[ $ps_rc -eq 0 ]] || fail "ps: the ps exited $ps_rc: $(tail -20 "$tmp/ps.ps.out")"
  ! has "Giving up" "$out" || fail "ps: the chief gave up: $out"
  how=$(grep -Eo "Recovered from a preemption error[^.]*|re-attached to the ps at global_step [0-9]+ \(latest checkpoint [0-9]+\)" <<<"$out" | head -2 | tr '\n' ';')
  echo "ps: the workers saw the ps lost ${c_took:-?} s / ${w_took:-?} s after the cut (connection timeout $timeout_ms ms);" \
       "healed, the chief recovered within $recovered s: $how"
fi

if ((failures > 0)); then
  for f in "$tmp"/*.out; do echo "--- $f:"; tail -40 "$f"; done
  failures_summary
  exit 1
fi
echo "cluster_partition_test: OK ($cases)"
