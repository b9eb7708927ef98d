#!/usr/bin/env bash
# Waits bounded by their settings against peers that hold a connection and
# never answer (issue 31 point 2; docs/cluster.md "Bounds"), and plain vs
# TLS named (issue 31 point 7). On 127.0.0.1 only; every wait is bounded;
# the trap kills only the processes this script started (a stopped ps is
# sent SIGCONT, then SIGKILL).
#   stopped:   a ps task that listens, then is SIGSTOPped (the kernel accepts
#              connections for it; no BASP handshake ever comes): worker 1
#              with --ps-wait-secs 3 exits 1 naming the ps and the wait
#              within 3 s + one connection timeout (+ start-up slack), and
#              `foreman cluster status` of it exits 1 within its --timeout-ms
#              (+ slack).
#   backlog:   a listener (python) with listen(0) that never accept()s or
#              reads, its backlog filled (a further SYN is dropped, so a
#              connect() hangs in the kernel): the same two bounds.
#   tls:       a TLS worker against a plain ps, and a plain worker against a
#              TLS ps: each exits 1 within the same bound, saying that the
#              ps does (not) speak TLS and that every task needs the same
#              --tls-* flags (certificates: tools/scripts/gen-tls-certs.sh).
#
#   cluster_waits_test.sh FOREMAN GEN_TLS_CERTS HEARTBEAT_MS CONNECTION_TIMEOUT_MS [CASES]
# CASES: a comma list of stopped,backlog,tls (default: all).
set -u
foreman=$1
gen_certs=$2
heartbeat_ms=$3
timeout_ms=$4
cases=${5:-stopped,backlog,tls}
NAME=cluster_waits_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"

bound=60
ps_wait_secs=3
status_timeout_ms=1500
# A task's start-up (flags, Fashion-MNIST, the actor system) and its exit,
# on a loaded 2-core machine, on top of each bound.
slack_ms=$(scaled 3000)  # times the suite's timing scale (tests/support/cluster_test_lib.sh)
model=(--hidden 16 --batch-size 50 --threads 1 --max-steps 1000000 --epochs 1000 --seed 7 --eval-every-steps 0)
stopped=()
# A stopped ps must be continued to die of the lib's SIGKILL at once and
# leave no zombie behind a group stop: SIGCONT first.
cleanup_waits() {
  local p
  for p in "${stopped[@]}"; do kill -CONT "$p" 2>/dev/null; done
  cleanup
}
trap cleanup_waits EXIT

now_ms() { date +%s%3N; }

# Starts a plain (or TLS: extra flags in $3...) ps task on port $1, output
# $tmp/$2; waits until it serves. Sets $ps_pid.
start_ps() {
  local port=$1 out=$2
  shift 2
  "$foreman" train "${model[@]}" --ps-hosts "127.0.0.1:$port" --worker-hosts "127.0.0.1:$((port + 1))" \
    --job-name ps --task-index 0 --ps-join-timeout-secs "$bound" --checkpoint-dir "$tmp/ps_unused" \
    --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms" "$@" >"$tmp/$out" 2>&1 &
  ps_pid=$!
  pids+=("$ps_pid")
  wait_for_line "Started foreman::Server /job:ps/task:0" "$tmp/$out" "$bound" "$ps_pid" \
    || fail "$out: the ps did not start: $(cat "$tmp/$out")"
}

# Runs worker 1 of a cluster whose ps is 127.0.0.1:$1 (extra flags: $3...),
# output $tmp/$2, bounded by $bound; sets $rc and $took_ms.
run_worker() {
  local port=$1 out=$2 start pid
  shift 2
  local ports
  ports=$(free_ports 2) || { echo "FAIL: cannot find free ports"; exit 1; }
  read -r chief_port worker_port <<<"$ports"
  start=$(now_ms)
  "$foreman" train "${model[@]}" --ps-hosts "127.0.0.1:$port" \
    --worker-hosts "127.0.0.1:$chief_port,127.0.0.1:$worker_port" --job-name worker --task-index 1 \
    --checkpoint-dir "$tmp/unused" --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms" \
    --ps-wait-secs "$ps_wait_secs" "$@" >"$tmp/$out" 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_bounded "$pid" "$bound"
  took_ms=$(($(now_ms) - start))
}

# Checks worker 1 ($1: the case, $2: output file) against a silent ps at
# port $3: exit 1, naming the ps task and the wait, within the bound.
check_silent_worker() {
  local name=$1 out=$2 port=$3 limit_ms=$((ps_wait_secs * 1000 + timeout_ms + slack_ms))
  [[ $rc -eq 1 ]] || fail "$name: worker 1 exited $rc, expected 1: $(tail -5 "$tmp/$out")"
  ((took_ms <= limit_ms)) \
    || fail "$name: worker 1 took $took_ms ms to give up (--ps-wait-secs $ps_wait_secs, --connection-timeout-ms $timeout_ms: at most $limit_ms ms)"
  has "ps task 0 \(127\.0\.0\.1:$port\).*--ps-wait-secs is $ps_wait_secs s" "$(cat "$tmp/$out")" \
    || fail "$name: worker 1 did not name the ps task and the wait: $(tail -5 "$tmp/$out")"
  # The wait itself, as the worker reports it: at most --ps-wait-secs + one
  # connection timeout (the last connect, bounded by what was left of it).
  local waited
  waited=$(sed -n 's/.*still unreachable after \([0-9.]*\) s of waiting.*/\1/p' "$tmp/$out" | tail -1)
  "$py" -c 'import sys; sys.exit(0 if 1000 * float(sys.argv[1]) <= int(sys.argv[2]) else 1)' "${waited:-1e9}" \
    "$((ps_wait_secs * 1000 + timeout_ms))" \
    || fail "$name: worker 1 waited ${waited:-?} s for the ps (--ps-wait-secs $ps_wait_secs + --connection-timeout-ms $timeout_ms)"
  echo "$name: worker 1 exited $rc after $took_ms ms (bound $limit_ms ms), having waited ${waited:-?} s for the ps"
}

# `foreman cluster status` of tcp://127.0.0.1:$2 ($1: the case): exit 1
# within --timeout-ms + slack.
check_silent_status() {
  local name=$1 port=$2 start out code took limit_ms=$((status_timeout_ms + slack_ms))
  start=$(now_ms)
  out=$(timeout "$bound" "$foreman" cluster status "tcp://127.0.0.1:$port" --timeout-ms "$status_timeout_ms" \
    --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms" 2>&1)
  code=$?
  took=$(($(now_ms) - start))
  [[ $code -eq 1 ]] || fail "$name: cluster status exited $code, expected 1: $out"
  ((took <= limit_ms)) || fail "$name: cluster status took $took ms (--timeout-ms $status_timeout_ms: at most $limit_ms ms)"
  has "127\.0\.0\.1:$port" "$out" || fail "$name: cluster status did not name the address: $out"
  echo "$name: cluster status exited $code after $took ms (bound $limit_ms ms)"
}

# (a) a SIGSTOPped ps.
if [[ ,$cases, == *,stopped,* ]]; then
  port=$(free_port_run 2) || { echo "FAIL: cannot find free ports"; exit 1; }
  start_ps "$port" stopped.ps.out
  kill -STOP "$ps_pid"
  stopped+=("$ps_pid")
  run_worker "$port" stopped.worker1.out
  check_silent_worker stopped stopped.worker1.out "$port"
  check_silent_status stopped "$port"
  kill -CONT "$ps_pid"
  kill_with_children "$ps_pid"
  wait "$ps_pid" 2>/dev/null
fi

# (b) a listener with a full backlog that never reads.
if [[ ,$cases, == *,backlog,* ]]; then
  "$py" -c '
import select, socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(0)
port = s.getsockname()[1]
# Fill the accept queue: connect until a SYN is not answered within 0.3 s
# (dropped: the queue is full).
held = []
for _ in range(16):
    c = socket.socket()
    c.setblocking(False)
    c.connect_ex(("127.0.0.1", port))
    held.append(c)
    if not select.select([], [c], [], 0.3)[1]:
        break
else:
    print("the backlog never filled", flush=True)
    sys.exit(1)
print("listening", port, len(held) - 1, flush=True)
time.sleep(float(sys.argv[1]))' "$((4 * bound))" >"$tmp/backlog.listener.out" 2>&1 &
  listener=$!
  pids+=("$listener")
  wait_for_line "^listening " "$tmp/backlog.listener.out" "$bound" "$listener" \
    || fail "backlog: the listener did not start: $(cat "$tmp/backlog.listener.out")"
  read -r _ port filled <"$tmp/backlog.listener.out"
  echo "backlog: listener on $port, $filled connection(s) fill its queue"
  run_worker "$port" backlog.worker1.out
  check_silent_worker backlog backlog.worker1.out "$port"
  check_silent_status backlog "$port"
  kill_with_children "$listener"
  wait "$listener" 2>/dev/null
fi

# (c) plain vs TLS.
if [[ ,$cases, == *,tls,* ]]; then
  certs=$tmp/certs
  "$gen_certs" "$certs" node || fail "gen-tls-certs.sh failed"
  tls=(--tls-cert "$certs/node.pem" --tls-key "$certs/node.key" --tls-ca "$certs/ca.pem")
  limit_ms=$((ps_wait_secs * 1000 + timeout_ms + slack_ms))
  # One side with the TLS flags, the other plain: worker 1 exits 1 within
  # the bound, naming the mismatch ($2: what it says of the ps's port).
  tls_mismatch() {
    local tls_side=$1 says=$2 what out
    port=$(free_port_run 2) || { echo "FAIL: cannot find free ports"; exit 1; }
    if [[ $tls_side == worker ]]; then
      what="a TLS worker against a plain ps"
      start_ps "$port" tls.plain_ps.out
      run_worker "$port" tls.tls_worker.out "${tls[@]}"
      out=$(cat "$tmp/tls.tls_worker.out")
    else
      what="a plain worker against a TLS ps"
      start_ps "$port" tls.tls_ps.out "${tls[@]}"
      run_worker "$port" tls.plain_worker.out
      out=$(cat "$tmp/tls.plain_worker.out")
    fi
    [[ $rc -eq 1 ]] || fail "tls: $what exited $rc, expected 1: $(tail -5 <<<"$out")"
    ((took_ms <= limit_ms)) || fail "tls: $what took $took_ms ms (at most $limit_ms ms)"
    has "the peer at 127\.0\.0\.1:$port $says.*same --tls-\*" "$out" \
      || fail "tls: $what did not name the mismatch: $(tail -5 <<<"$out")"
    echo "tls: $what exited $rc after $took_ms ms"
    kill_with_children "$ps_pid"
    wait "$ps_pid" 2>/dev/null
  }
  tls_mismatch worker "does not speak TLS"
  tls_mismatch ps "speaks TLS"
fi

failures_summary
((failures == 0))
