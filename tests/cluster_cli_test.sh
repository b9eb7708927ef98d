#!/usr/bin/env bash
# `foreman cluster local` and `foreman cluster status` (docs/cluster.md), on
# 127.0.0.1 only, every wait bounded; the trap kills only the processes this
# script started.
#   1. Bad input: exit 2 naming the flag; a status of a closed port exits 1
#      and says "unreachable".
#   2. `cluster local --ps 1 --workers 2 --max-steps 30` runs to completion:
#      exit 0, every output line prefixed with its task, the chief's final
#      checkpoint written.                          (also under the sanitizers)
#   3. A `cluster local` run ended by a SIGTERM (forwarded to the chief): while
#      it trains, `cluster status` of the ps prints its global_step and, per
#      worker, its applies and last_apply_ms; that of the chief lists worker 1
#      with its steps, each worker's last_apply_ms (ps 0's view) and the ps's
#      last_answer_ms (the chief's view), each below the connection timeout;
#      junk on the ps's port (random bytes, a truncated BASP header, a
#      connect-and-close) does not stop it (its global_step still grows); a
#      32-byte header claiming 4 GiB (a direct message, a client handshake)
#      has its connection closed at once and the ps's VmHWM grows < 256 MiB
#      (1 GiB under the sanitizers); a flood of 200 connections held open: all
#      accepted (the ps's fds), its global_step still grows, and after they
#      close its fds return and it is alive; the SIGTERM ends the run with
#      exit 0 and the final checkpoint; the chief's event file has
#      steps_per_sec/worker_0 and a steps_per_sec/worker_1 > 0 (its
#      --save-summaries-steps 2).                   (also under the sanitizers)
#   4. TLS (certificates from tools/scripts/gen-tls-certs.sh), release only: a
#      TLS cluster trains; `cluster status tls://` with a certificate of the
#      CA prints the ps's global_step; with a rogue certificate (another CA) or
#      over plain tcp:// it is refused (exit 1, the handshake named); a
#      `foreman train` worker with the rogue certificate is refused (the
#      handshake named) and trains no step while the others keep training;
#      junk (random bytes, a truncated TLS ClientHello) on the ps's port does
#      not stop training.
#
#   cluster_cli_test.sh FOREMAN GEN_TLS_CERTS HEARTBEAT_MS CONNECTION_TIMEOUT_MS [small]
set -u
foreman=$1
gen_certs=$2
heartbeat_ms=$3
timeout_ms=$4
small=${5:-}
NAME=cluster_cli_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"
bound=120

# ps 0's global_step from `cluster status` output $1 (empty if none).
ps_step() { sed -n 's/^ps 0  .*  global_step \([0-9]*\) .*/\1/p' <<<"$1"; }

# The value of field $1 ("last_apply_ms", ...) in status line $2 (empty if none).
field() { sed -n "s/.*  $1 \([0-9][0-9]*\)\(  .*\)\{0,1\}\$/\1/p" <<<"$2"; }

# Fails unless field $1 of the line of $3 matching $2 is a number below the
# connection timeout (a live task was heard from within it).
heard_within_timeout() {
  local line v
  line=$(grep -E "$2" <<<"$3" | head -1)
  v=$(field "$1" "$line")
  [[ $v =~ ^[0-9]+$ && $v -lt $timeout_ms ]] || fail "$1 of '$2' is '$v', expected < $timeout_ms ms: $3"
}

# Asks `cluster status $1 [flags]` (at most 10 s) until ps 0's global_step
# exceeds $2; sets $step. False if it never did.
step=""
wait_step_above() {
  local target=$1 above=$2 i out
  shift 2
  for ((i = 0; i < 50; i++)); do
    out=$(timeout 30 "$foreman" cluster status "$target" "$@" --heartbeat-ms "$heartbeat_ms" \
          --connection-timeout-ms "$timeout_ms" 2>&1)
    step=$(ps_step "$out")
    [[ $step =~ ^[0-9]+$ ]] && ((step > above)) && return 0
    sleep 0.2
  done
  echo "last status of $target: $out"
  return 1
}

# Sends junk to 127.0.0.1:$1: random bytes, then $2 (hex) and a close, then a
# connect-and-close. Bounded (2 s per connection).
junk() {
  "$py" - "$1" "$2" <<'EOF'
import os, socket, sys
port, head = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
for payload in (os.urandom(200), head, b""):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.sendall(payload)
    s.close()
EOF
}

model=(--hidden 16 --batch-size 50 --threads 1 --optimizer adam --seed 3 --eval-every-steps 0
       --heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms")

# 1. Bad input.
out=$("$foreman" cluster local --workers 0 --checkpoint-dir "$tmp/bad" 2>&1); code=$?
[[ $code -eq 2 ]] || fail "--workers 0 exited $code, expected 2: $out"
has "--workers must be in \[1, 64\], got 0" "$out" || fail "--workers 0 is not named: $out"
out=$("$foreman" cluster local --task-index 1 --checkpoint-dir "$tmp/bad" 2>&1); code=$?
[[ $code -eq 2 ]] || fail "cluster local --task-index exited $code, expected 2: $out"
has "--task-index is set by .cluster local. itself" "$out" || fail "--task-index is not refused by name: $out"
out=$("$foreman" cluster status 127.0.0.1:1 2>&1); code=$?
[[ $code -eq 2 ]] || fail "a status target without a scheme exited $code, expected 2: $out"
has "expected tcp://HOST:PORT or tls://HOST:PORT" "$out" || fail "a bad status target is not explained: $out"
closed=$(free_ports 1)
out=$(timeout 30 "$foreman" cluster status "tcp://127.0.0.1:$closed" 2>&1); code=$?
[[ $code -eq 1 ]] || fail "a status of a closed port exited $code, expected 1: $out"
has "^\?  127.0.0.1:$closed  unreachable: " "$out" || fail "a closed port is not printed as unreachable: $out"
[[ ! -e $tmp/bad ]] || fail "a refused cluster local created its --checkpoint-dir"

# A ps task given a SIGTERM says what a ps does (not "before training
# started"), refuses updates and, with no chief applying, exits 75 at once
# (stopped, not finished).
ports=$(free_ports 2)
read -r p_ps p_w <<<"$ports"
"$foreman" train "${model[@]}" --ps-hosts "127.0.0.1:$p_ps" --worker-hosts "127.0.0.1:$p_w" --job-name ps \
  --task-index 0 --checkpoint-dir "$tmp/ps_unused" >"$tmp/ps.out" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
wait_for_line "ps task 0 serving at tcp://127.0.0.1:$p_ps" "$tmp/ps.out" "$bound" "$ps_pid" \
  || fail "the lone ps did not start: $(cat "$tmp/ps.out")"
kill -TERM "$ps_pid"
wait_bounded "$ps_pid" 30
out=$(cat "$tmp/ps.out")
[[ $rc -eq 75 ]] || fail "a ps stopped by SIGTERM exited $rc, expected 75: $out"
has "SIGTERM received: ps task 0 refuses updates from now on \(stopping, evicted\)" "$out" \
  || fail "the ps's signal message: $out"
has "stopping \(evicted\): no chief is applying to it, nothing to wait for; exiting" "$out" \
  || fail "the lone ps waited for a chief: $out"
! has "before training started" "$out" || fail "the ps speaks of training: $out"

echo "section 2 at $SECONDS s"
# 2. A short job to completion.
start=$SECONDS
out=$(timeout "$bound" "$foreman" cluster local --ps 1 --workers 2 "${model[@]}" --max-steps 30 \
      --checkpoint-dir "$tmp/short" 2>&1); code=$?
[[ $code -eq 0 ]] || fail "cluster local --max-steps 30 exited $code: $out"
has "^foreman cluster local: 1 ps task\(s\) at 127.0.0.1:[0-9]+; 2 worker\(s\) at 127.0.0.1:[0-9]+,127.0.0.1:[0-9]+" \
  "$out" || fail "cluster local did not say where its tasks are: $out"
final=$(sed -n 's/^\[worker 0\] training ended at global_step \([0-9]*\)$/\1/p' <<<"$out")
[[ $final =~ ^[0-9]+$ && $final -ge 30 ]] || fail "the chief did not end training at a global_step >= 30: $out"
[[ -f $tmp/short/model.ckpt-$final.index ]] || fail "no final checkpoint model.ckpt-$final: $(ls "$tmp/short" 2>&1)"
has "^\[ps 0\] ps task 0: training ended; exiting" "$out" || fail "the ps did not end with the chief: $out"
has "^foreman cluster local: exit codes: ps 0 0, worker 0 0, worker 1 0$" "$out" || fail "a task failed: $out"
bad=$(grep -Ev '^(\[(ps 0|worker [01])\] |foreman cluster local: )' <<<"$out" | head -3)
[[ -z $bad ]] || fail "lines without their task's prefix: $bad"
echo "short run: global_step $final in $((SECONDS - start)) s"

echo "section 3 at $SECONDS s"
# 3. A run ended by a SIGTERM; status and junk while it trains.
"$foreman" cluster local --ps 1 --workers 2 "${model[@]}" --max-steps 1000000 --epochs 1000 --log-step-count-steps 1 \
  --save-summaries-steps 2 --checkpoint-dir "$tmp/long" >"$tmp/long.out" 2>"$tmp/long.err" &
local_pid=$!
pids+=("$local_pid")
wait_for_line "^\[worker 0\] step [0-9]+" "$tmp/long.err" "$bound" "$local_pid" || fail "the chief trained no step"
wait_for_line "^\[worker 1\] step [0-9]+" "$tmp/long.err" "$bound" "$local_pid" || fail "worker 1 trained no step"
ps_addr=$(sed -n 's/^foreman cluster local: 1 ps task(s) at \([0-9.:]*\);.*/\1/p' "$tmp/long.err")
chief_addr=$(sed -n 's/^foreman cluster local: .* 2 worker(s) at \([0-9.:]*\),.*/\1/p' "$tmp/long.err")
out=$(timeout 30 "$foreman" cluster status "tcp://$ps_addr" 2>&1); code=$?
[[ $code -eq 0 ]] || fail "cluster status of the ps exited $code: $out"
before=$(ps_step "$out")
[[ $before =~ ^[0-9]+$ && $before -ge 1 ]] || fail "cluster status of the ps printed no global_step >= 1: $out"
has "^  worker 0  applies [1-9][0-9]*  last_apply_ms [0-9]+$" "$out" || fail "the ps's status lacks worker 0: $out"
has "^  worker 1  applies [1-9][0-9]*  last_apply_ms [0-9]+$" "$out" || fail "the ps's status lacks worker 1: $out"
heard_within_timeout last_apply_ms "^  worker 1  " "$out"
out=$(timeout 30 "$foreman" cluster status "tcp://$chief_addr" 2>&1); code=$?
[[ $code -eq 0 ]] || fail "cluster status of the chief exited $code: $out"
has "^worker 0  $chief_addr  serving \(chief\)  steps [0-9]+  job spec-[0-9a-f]{12}  last_apply_ms [0-9]+$" "$out" \
  || fail "the chief's line: $out"
has "^ps 0  $ps_addr  serving  global_step [0-9]+  applied_updates [0-9]+  refused_updates 0  job spec-[0-9a-f]{12}  last_answer_ms [0-9]+$" \
  "$out" || fail "the chief's status lacks the ps: $out"
has "^worker 1  127.0.0.1:[0-9]+  serving  steps [1-9][0-9]*  job spec-[0-9a-f]{12}  last_apply_ms [0-9]+$" "$out" \
  || fail "the chief's status lacks worker 1: $out"
heard_within_timeout last_apply_ms "^worker 0  " "$out"
heard_within_timeout last_answer_ms "^ps 0  " "$out"
heard_within_timeout last_apply_ms "^worker 1  " "$out"
# Junk: 200 random bytes, a 20-byte truncated BASP header, a connect-and-close.
junk "${ps_addr##*:}" "0000000000000000ffffffff0000000000000001" || fail "cannot send junk to the ps"
wait_step_above "tcp://$ps_addr" "${before:-0}" || fail "the ps's global_step did not grow after junk on its port"
# The BASP header guard and a flood, on the ps's port (its process: the
# child of cluster local with --job-name ps).
ps_pid=""
for child in $(pgrep -P "$local_pid"); do
  tr '\0' ' ' <"/proc/$child/cmdline" 2>/dev/null | grep -q -- "--job-name ps " && ps_pid=$child
done
if [[ -z $ps_pid ]]; then
  fail "cannot find the ps task's process under cluster local ($local_pid)"
else
  proc_kib() { sed -n "s/^$1:[[:space:]]*\([0-9]*\) kB/\1/p" "/proc/$ps_pid/status"; }
  fds() { find "/proc/$ps_pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
  hwm0=$(proc_kib VmHWM)
  fds0=$(fds)
  # Peak RSS growth allowed (kB): far below one 4 GiB claim; more under the
  # sanitizers, whose allocator quarantine grows while the ps trains.
  hwm_slack=262144
  [[ $small == small ]] && hwm_slack=1048576
  # Headers CAF 0.17.6 accepts and sizes its read buffer to (4 GiB each):
  # the node must close each connection at once, allocating nothing.
  guard_out=$("$py" - "${ps_addr##*:}" 2>&1 <<'EOF'
import socket, sys, time
port = int(sys.argv[1])
def header(op, length, dest):
    return bytes([op, 0, 0, 0]) + length.to_bytes(4, "big") + bytes(16) + dest.to_bytes(8, "big")
for what, h in (("a direct message claiming 4 GiB", header(2, 0xFFFFFFFF, 1)),
                ("a client handshake claiming 4 GiB", header(1, 0xFFFFFFFF, 0))):
    s = socket.create_connection(("127.0.0.1", port), timeout=3)
    s.sendall(h)
    deadline = time.monotonic() + 3
    try:
        while time.monotonic() < deadline and s.recv(65536):
            pass
        closed = time.monotonic() < deadline
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        closed = False
    s.close()
    print(("closed: " if closed else "NOT closed within 3 s: ") + what)
EOF
  )
  [[ $(grep -c "^closed: " <<<"$guard_out") -eq 2 ]] || fail "the ps kept a 4 GiB header's connection open: $guard_out"
  hwm1=$(proc_kib VmHWM)
  ((hwm1 - hwm0 < hwm_slack)) || fail "the ps's peak RSS grew from $hwm0 to $hwm1 kB after 4 GiB headers"
  # A flood: 200 connections opened and held (each gets the ps's server
  # handshake) while training goes on, then closed.
  "$py" - "${ps_addr##*:}" "$tmp/flood" <<'EOF' &
import os, socket, sys, time
port, flag = int(sys.argv[1]), sys.argv[2]
held = [socket.create_connection(("127.0.0.1", port), timeout=3) for _ in range(200)]
open(flag + ".open", "w").write("open\n")
deadline = time.monotonic() + 60
while not os.path.exists(flag + ".close") and time.monotonic() < deadline:
    time.sleep(0.05)
for s in held:
    s.close()
EOF
  flood_pid=$!
  pids+=("$flood_pid")
  wait_for_line "open" "$tmp/flood.open" 30 "$flood_pid" || fail "the flood could not open 200 connections"
  # The client's connects complete in the kernel's backlog; the ps accepts
  # them as its multiplexer gets to them (bounded wait).
  for ((i = 0; i < 200; i++)); do
    fds_held=$(fds)
    ((fds_held >= fds0 + 200)) && break
    sleep 0.05
  done
  ((fds_held >= fds0 + 200)) || fail "the ps holds $fds_held fds 10 s into the flood (had $fds0): not all accepted"
  out=$(timeout 30 "$foreman" cluster status "tcp://$ps_addr" 2>&1)
  during=$(ps_step "$out")
  wait_step_above "tcp://$ps_addr" "${during:-0}" || fail "the ps's global_step did not grow during a flood of 200 connections"
  touch "$tmp/flood.close"
  wait_bounded "$flood_pid" 30
  for ((i = 0; i < 100; i++)); do (($(fds) <= fds0 + 2)) && break; sleep 0.05; done
  fds_after=$(fds)
  ((fds_after <= fds0 + 2)) || fail "the ps's fds did not return after the flood: $fds0 before, $fds_held held, $fds_after after"
  hwm2=$(proc_kib VmHWM)
  ((hwm2 - hwm0 < hwm_slack)) || fail "the ps's peak RSS grew from $hwm0 to $hwm2 kB during the flood"
  [[ -d /proc/$ps_pid ]] || fail "the ps task died after the 4 GiB headers and the flood"
  echo "guard and flood: ps VmHWM $hwm0 -> $hwm1 -> $hwm2 kB; fds $fds0, $fds_held held, $fds_after after"
fi
kill -TERM "$local_pid"
wait_bounded "$local_pid" "$bound"
long_out=$(cat "$tmp/long.out")
long_err=$(cat "$tmp/long.err")
[[ $rc -eq 0 ]] || fail "cluster local ended by SIGTERM exited $rc: $long_out $long_err"
has "SIGTERM received: forwarded to the chief" "$long_err" || fail "the SIGTERM was not forwarded to the chief: $long_err"
has "^\[worker 0\] stopped by SIGTERM after its final checkpoint" "$long_out" \
  || fail "the chief did not stop at the SIGTERM: $long_out"
final=$(sed -n 's/^\[worker 0\] training ended at global_step \([0-9]*\)$/\1/p' <<<"$long_out")
[[ $final =~ ^[0-9]+$ && -f $tmp/long/model.ckpt-$final.index ]] || fail "no final checkpoint at $final: $long_out"
has "^\[worker 1\] worker 1: the chief ended training" "$long_out" || fail "worker 1 did not stop at the end: $long_out"
# The chief's per-worker steps/s (docs/cluster.md "Observability").
events=$("$foreman" events --tag steps_per_sec/worker_0 "$tmp/long" 2>&1) || fail "foreman events failed: $events"
has "scalar  steps_per_sec/worker_0 = [0-9]" "$events" || fail "the chief wrote no steps_per_sec/worker_0: $events"
events=$("$foreman" events --tag steps_per_sec/worker_1 "$tmp/long" 2>&1) || fail "foreman events failed: $events"
has "scalar  steps_per_sec/worker_1 = ([1-9]|0\.0*[1-9])" "$events" \
  || fail "the chief wrote no steps_per_sec/worker_1 > 0: $events"

echo "section 4 at $SECONDS s"
# 4. TLS.
if [[ $small != small ]]; then
  certs=$tmp/certs
  start=$SECONDS
  "$gen_certs" --rogue rogue "$certs" node || fail "gen-tls-certs.sh failed"
  echo "certificates made in $((SECONDS - start)) s"
  tls=(--tls-cert "$certs/node.pem" --tls-key "$certs/node.key" --tls-ca "$certs/ca.pem")
  rogue=(--tls-cert "$certs/rogue.pem" --tls-key "$certs/rogue.key" --tls-ca "$certs/rogue-ca.pem")
  "$foreman" cluster local --ps 1 --workers 2 "${model[@]}" "${tls[@]}" --max-steps 1000000 --epochs 1000 \
    --log-step-count-steps 1 --checkpoint-dir "$tmp/tls" >"$tmp/tls.out" 2>"$tmp/tls.err" &
  tls_pid=$!
  pids+=("$tls_pid")
  wait_for_line "^\[worker 0\] step [0-9]+" "$tmp/tls.err" "$bound" "$tls_pid" || fail "the TLS chief trained no step"
  wait_for_line "^\[worker 1\] step [0-9]+" "$tmp/tls.err" "$bound" "$tls_pid" || fail "TLS worker 1 trained no step"
  ps_addr=$(sed -n 's/^foreman cluster local: 1 ps task(s) at \([0-9.:]*\);.*/\1/p' "$tmp/tls.err")
  out=$(timeout 30 "$foreman" cluster status "tls://$ps_addr" "${tls[@]}" 2>&1); code=$?
  before=$(ps_step "$out")
  [[ $code -eq 0 && $before =~ ^[0-9]+$ && $before -ge 1 ]] \
    || fail "cluster status tls:// exited $code without a global_step >= 1: $out"
  out=$(timeout 30 "$foreman" cluster status "tls://$ps_addr" "${rogue[@]}" 2>&1); code=$?
  [[ $code -eq 1 ]] || fail "a status with a rogue certificate exited $code, expected 1: $out"
  has "unreachable: .*handshake" "$out" || fail "a rogue status does not name the handshake: $out"
  out=$(timeout 30 "$foreman" cluster status "tcp://$ps_addr" 2>&1); code=$?
  [[ $code -eq 1 ]] || fail "a plain status of a TLS port exited $code, expected 1: $out"
  # A rogue worker (its own spare address): refused at the handshake, no step.
  spare=$(free_ports 1)
  "$foreman" train "${model[@]}" "${rogue[@]}" --max-steps 1000000 --epochs 1000 --ps-hosts "$ps_addr" \
    --worker-hosts "$chief_addr,127.0.0.1:$spare" --job-name worker --task-index 1 --checkpoint-dir "$tmp/rogue" \
    --ps-wait-secs 2 >"$tmp/rogue.out" 2>&1 &
  rogue_pid=$!
  pids+=("$rogue_pid")
  wait_for_line "closed the connection during the TLS/BASP handshake" "$tmp/rogue.out" 30 "$rogue_pid" \
    || fail "the rogue worker was not refused at the handshake: $(cat "$tmp/rogue.out")"
  junk "${ps_addr##*:}" "160301020001000200" || fail "cannot send junk to the TLS ps"
  kill -TERM "$rogue_pid" 2>/dev/null
  wait_bounded "$rogue_pid" 30
  ! grep -Eq "^step [0-9]+" "$tmp/rogue.out" || fail "the rogue worker trained: $(cat "$tmp/rogue.out")"
  # The TLS ps still trains after a status, a rogue worker and junk: CAF
  # 0.17.6's openssl module used to stall it here (a failed handshake's
  # error left on OpenSSL's queue; actors/tls_error_queue.cpp clears it).
  wait_step_above "tls://$ps_addr" "${before:-0}" "${tls[@]}" \
    || fail "the TLS ps's global_step did not grow after a status, a rogue worker and junk"
  kill -TERM "$tls_pid"
  wait_bounded "$tls_pid" "$bound"
  [[ $rc -eq 0 ]] || fail "the TLS cluster ended by SIGTERM exited $rc: $(grep -Ev '\] step|global_step/sec' "$tmp/tls.out" "$tmp/tls.err" | tail -20)"
fi

echo "done at $SECONDS s"
if ((failures > 0)); then
  failures_summary
  exit 1
fi
echo "cluster_cli_test: OK"
