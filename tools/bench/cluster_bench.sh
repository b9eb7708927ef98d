#!/usr/bin/env bash
# Issue 13 point 8: training throughput of one process vs a cluster on
# 127.0.0.1 (`foreman train` as ps and workers), one intra-op thread per
# process, the main job's model (MLP 784-256-10, Adam, batch 128). The
# configurations alternate within each repetition; every line (report.py's
# runs.txt format) is
#   RUN cluster.<config> <samples/s> samples/s steps_per_sec=.. cpu_ms_per_step=.. [reads=.. read_us=..
#       read_bytes=.. applies=.. apply_us=.. apply_bytes=..]
# where <config> is single, ps1_w1, ps1_w2 (async) or ps1_w2_sync (1 ps + 2
# workers, --replicas-to-aggregate 2: SyncReplicasOptimizer). A worker's rate
# counts its own steps from its first step (train.cpp's report); ps1_w2 sums
# both workers' (each step is a global step); ps1_w2_sync's samples/s sums
# both workers' (each global step aggregates 2 batches of 128) and its
# steps_per_sec is the global steps/s (the mean of the two workers' rates:
# each worker makes one step per global step), with stale=<gradients the ps
# dropped as stale> from the ps's end-of-training line. cpu_ms_per_step: user
# + system CPU time of all the processes (start-up, data loading and the
# final checkpoint included) over the global steps: on a shared machine the
# wall-clock rates swing with the load, the CPU cost much less. The network
# figures are worker 0's PsRemoteValues counters (FOREMAN_CLUSTER_STATS=1,
# logged at its end): the mean wall time of a read (ReadForStep, plus the
# few full reads) and of an apply, and the tensor bytes each carried
# (payload only, without CAF's framing).
#
# Then --recovery-reps times the ps-kill recovery (issue 13 point 8): 1 ps +
# 1 worker (the chief, checkpoints every 200 steps), --heartbeat-ms 200
# --connection-timeout-ms 1000; past step 300 the ps gets kill -9 and is
# restarted on the same port 0.5 s later; each line is
#   RUN cluster.ps_kill_recovery_s <s> s recovered_s=.. restarted_s=.. reachable_s=.. restore_s=.. steps_lost=..
# <s>: from the kill to the chief's first progress line ("step N: ...", one
# per step) after its "Recovered from a preemption error" line; recovered_s:
# from the kill to that line (the chief's restore from its latest checkpoint
# done); restarted_s: from the kill to the restarted ps's exec (0.5 s +
# bash's fork); reachable_s: from the kill to the chief's "Recovery: the ps
# tasks are reachable again" line; restore_s: from that line to the
# "Recovered" line (the chief's new session: restoring every ps task from the
# latest checkpoint); steps_lost: the global steps since that checkpoint. The times are the arrival times of the chief's stderr lines
# (unbuffered) at a timestamping reader, against the kill's $EPOCHREALTIME.
#
# --workers LIST (default 1,2): the asynchronous clusters run, 1 ps + N workers
# for each N (issue 27 point 4: 1,2,4,8 on a bigger machine); the synchronous
# one runs with 2 workers when 2 is in the list. Where the machine has a core
# for every task (N + 1 <= the CPUs this process may use), each task is
# pinned to its own core with taskset (the ps on the first, worker i on the
# (i+2)-th; the one process on the second); otherwise nothing is pinned.
#
# --tcp-roundtrip BIN (run.sh passes its build's tools/bench/tcp_roundtrip):
# after each 1 ps + 1 worker run, the floor under its round trip — worker
# 0's apply bytes each way (the answer carries the same variables, 16 bytes
# more: global_step), traded 2000 times over plain loopback TCP between two
# processes pinned as the ps and the worker are (tcp_roundtrip.cpp), one line
#   RUN cluster.tcp_roundtrip_us <median> us p10=.. p90=.. request_bytes=.. answer_bytes=.. reps=..
#
# Usage: tools/bench/cluster_bench.sh FOREMAN_BIN [--steps N] [--reps N] [--recovery-reps N] [--data DIR]
#        [--workers 1,2,4,8] [--tcp-roundtrip BIN]
# (run.sh --parts 6 runs it with its build and --reps; --reps 0 runs only the
# recovery, --recovery-reps 0 none). CLUSTER_BENCH_KEEP=1 keeps the processes'
# outputs (the last run of each configuration) and names their directory.
set -euo pipefail
foreman=${1:?usage: cluster_bench.sh FOREMAN_BIN [--steps N] [--reps N] [--recovery-reps N] [--data DIR] [--workers LIST]}
shift
steps=2000
reps=3
recovery_reps=5
data=/usr/share/datasets/fashion-mnist
workers_csv=1,2
tcp_roundtrip=
while (($#)); do
  case $1 in
    --steps) steps=$2; shift ;;
    --reps) reps=$2; shift ;;
    --recovery-reps) recovery_reps=$2; shift ;;
    --data) data=$2; shift ;;
    --workers) workers_csv=$2; shift ;;
    --tcp-roundtrip) tcp_roundtrip=$2; shift ;;
    *) echo "cluster_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
IFS=, read -ra worker_counts <<<"$workers_csv"
if [[ -n $tcp_roundtrip && ! -x $tcp_roundtrip ]]; then
  echo "cluster_bench.sh: --tcp-roundtrip $tcp_roundtrip is not an executable" >&2; exit 2
fi
for n in "${worker_counts[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "cluster_bench.sh: --workers wants worker counts >= 1 separated by commas, not '$workers_csv'" >&2; exit 2; }
done
mapfile -t cpus < <(/usr/bin/python3 -c 'import os; print("\n".join(map(str, sorted(os.sched_getaffinity(0)))))')
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cluster_bench.XXXXXX")
pids=()
cleanup() {
  # A pid is /usr/bin/time's (its child first) or, in the recovery runs, foreman's.
  for p in "${pids[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ -n ${CLUSTER_BENCH_KEEP:-} ]]; then log "outputs kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
log() { echo "cluster_bench: $*" >&2; }
# $(pin K): "taskset -c <the K-th CPU this process may use>" (0-based) when
# the current configuration pins (pin_tasks=1), else nothing.
pin_tasks=0
pin() { if ((pin_tasks)); then echo "taskset -c ${cpus[$1]}"; fi; }
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
model=(--threads 1 --optimizer adam --batch-size 128 --hidden 256 --seed 0 --data-dir "$data"
       --eval-every-steps 0 --log-step-count-steps 0 --save-checkpoint-secs 3600 --save-summaries-steps 100000)
# "trained N steps in T s (R steps/s, E examples/s)" -> R
rate_of() { sed -n 's/.*trained [0-9]* steps in [0-9.]* s (\([0-9.]*\) steps\/s.*/\1/p' "$1" | tail -1; }
timed() { local f=$1; shift; /usr/bin/time -f '%U %S' -o "$f" "$@"; }  # timed FILE CMD...: CPU seconds into FILE
cpu_of() { awk '{ s += $1 + $2 } END { print s + 0 }' "$@"; }            # user + sys of the FILEs
stats_of() { sed -n 's/.*cluster stats: \(.*\)$/\1/p' "$1" | tail -1; }
# Bytes copied in user space by every process of a configuration (tensor_bytes.hpp's
# counters: serialized + deserialized + copied, logged at each task's end).
copies_of() {
  sed -n 's/.*\(cluster\|transport\) stats: .*serialized=\([0-9]*\) deserialized=\([0-9]*\) copied=\([0-9]*\).*/\2 \3 \4/p' "$@" |
    awk '{ s += $1 + $2 + $3 } END { print s + 0 }'
}

run_single() {
  local d=$tmp/single
  rm -rf "$d"; mkdir -p "$d"
  timed "$d/time" $(pin 1) timeout 600 "$foreman" train --checkpoint-dir "$d/ckpt" "${model[@]}" --max-steps "$steps" \
    >"$d/out" 2>&1 || { log "single process failed:"; cat "$d/out" >&2; return 1; }
  local r; r=$(rate_of "$d/out")
  awk -v r="$r" -v cpu="$(cpu_of "$d/time")" -v n="$steps" \
    'BEGIN { printf "RUN cluster.single %.0f samples/s steps_per_sec=%.1f cpu_ms_per_step=%.3f\n", r * 128, r, cpu * 1000 / n }'
}

run_cluster() {  # run_cluster WORKERS [sync]: sync aggregates all WORKERS' gradients of a step
  local n=$1 mode=${2:-async} d=$tmp/c$1${2:-} ps_port wk=() hosts=() i config=ps1_w$1 sync=()
  if [[ $mode == sync ]]; then config=ps1_w${n}_sync; sync=(--replicas-to-aggregate "$n"); fi
  rm -rf "$d"; mkdir -p "$d"
  pin_tasks=$((n + 1 <= ${#cpus[@]}))
  ps_port=$(free_port)
  for ((i = 0; i < n; ++i)); do wk+=("$(free_port)"); hosts+=("127.0.0.1:${wk[i]}"); done
  local net=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "$(IFS=,; echo "${hosts[*]}")" "${sync[@]}")
  FOREMAN_CLUSTER_STATS=1 timed "$d/ps.time" $(pin 0) "$foreman" train "${model[@]}" "${net[@]}" --job-name ps --task-index 0 --ps-join-timeout-secs 600 \
    >"$d/ps.out" 2>&1 &
  local ps_pid=$!; pids+=("$ps_pid")
  local wpids=()
  for ((i = n - 1; i >= 0; --i)); do
    FOREMAN_CLUSTER_STATS=1 timed "$d/w$i.time" $(pin $((i + 1))) timeout 600 "$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index "$i" \
      --checkpoint-dir "$d/ckpt$i" --max-steps "$steps" --ps-wait-secs 60 >"$d/w$i.out" 2>&1 &
    wpids+=($!); pids+=($!)
  done
  local ok=1
  for p in "${wpids[@]}"; do wait "$p" || ok=0; done
  wait "$ps_pid" || ok=0
  pids=()
  if ((!ok)); then log "cluster of $n workers ($mode) failed:"; tail -n 20 "$d"/*.out >&2; return 1; fi
  local total=0 r global extra=""
  for ((i = 0; i < n; ++i)); do r=$(rate_of "$d/w$i.out"); total=$(awk -v a="$total" -v b="${r:-0}" 'BEGIN { print a + b }'); done
  global=$total
  if [[ $mode == sync ]]; then
    global=$(awk -v t="$total" -v n="$n" 'BEGIN { print t / n }')
    # "..., D stale gradients dropped, ..." in the ps's end-of-training line
    extra="stale=$(sed -n 's/.*, \([0-9]*\) stale gradients dropped.*/\1/p' "$d/ps.out" | tail -1) "
  fi
  local w0_stats; w0_stats=$(stats_of "$d/w0.out")
  awk -v r="$total" -v g="$global" -v c="$config" -v x="$extra" -v s="$w0_stats" -v cpu="$(cpu_of "$d"/*.time)" \
    -v steps="$steps" -v copies="$(copies_of "$d"/*.out)" \
    'BEGIN { printf "RUN cluster.%s %.0f samples/s steps_per_sec=%.1f cpu_ms_per_step=%.3f copied_per_step=%.0f %s%s\n", c, r * 128, g, cpu * 1000 / steps, copies / steps, x, s }'
  if [[ -n $tcp_roundtrip && $n == 1 && $mode == async ]]; then run_tcp_roundtrip "$w0_stats"; fi
}

# run_tcp_roundtrip STATS: worker 0's stats line gives the bytes (its
# apply_bytes; bytes_in also counts its few full reads, with the slots). A
# failure is logged and skips the row; the benchmark goes on.
run_tcp_roundtrip() {
  local bytes
  bytes=$(sed -n 's/.*apply_bytes=\([0-9]*\).*/\1/p' <<<"$1")
  [[ $bytes =~ ^[1-9][0-9]*$ ]] || { log "no apply_bytes in worker 0's stats: tcp_roundtrip skipped"; return 0; }
  local cpu_args=()
  if ((pin_tasks)); then cpu_args=("${cpus[0]}" "${cpus[1]}"); fi
  "$tcp_roundtrip" "$bytes" "$((bytes + 16))" 2000 "${cpu_args[@]}" || log "tcp_roundtrip failed: no floor row"
}

# The ps-kill recovery (header): one repetition, one RUN line.
stamp() { /usr/bin/python3 -u -c '
import sys, time
for line in iter(sys.stdin.readline, ""):
    sys.stdout.write("%.6f %s" % (time.time(), line))'; }
# wait_until SECONDS CMD...: polls CMD every 50 ms; 1 past SECONDS
wait_until() {
  local end=$((SECONDS + $1)); shift
  until "$@"; do ((SECONDS < end)) || return 1; sleep 0.05; done
}
past_step() { [[ -f $1 ]] && awk -v n="$2" '$2 == "step" && $3 + 0 > n { f = 1 } END { exit !f }' "$1"; }
# The timestamps of the last "reachable again" line before the "Recovered"
# line, of that line, and of the first step line after it.
recovered_times() {
  awk '/the ps tasks are reachable again/ && !r { a = $1 }
       /Recovered from a preemption error/ && !r { r = $1; next }
       r && $2 == "step" { print a ? a : r, r, $1; exit }' "$1"
}
has_recovered() { [[ -n $(recovered_times "$1") ]]; }
gone() { ! kill -0 "$1" 2>/dev/null; }
run_recovery() {
  local d=$tmp/recovery ps_port w_port
  rm -rf "$d"; mkdir -p "$d"
  ps_port=$(free_port); w_port=$(free_port)
  local net=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "127.0.0.1:$w_port" --heartbeat-ms 200 --connection-timeout-ms 1000)
  local rmodel=(--threads 1 --optimizer adam --batch-size 128 --hidden 256 --seed 0 --data-dir "$data"
                --eval-every-steps 0 --log-step-count-steps 1 --save-checkpoint-steps 200 --save-summaries-steps 100000)
  "$foreman" train "${rmodel[@]}" "${net[@]}" --job-name ps --task-index 0 --ps-join-timeout-secs 600 >"$d/ps.out" 2>&1 &
  local ps_pid=$!; pids+=("$ps_pid")
  "$foreman" train "${rmodel[@]}" "${net[@]}" --job-name worker --task-index 0 --checkpoint-dir "$d/ckpt" \
    --max-steps 100000000 --ps-wait-secs 60 >"$d/chief.report" 2> >(stamp >"$d/chief.err") &
  local chief_pid=$!; pids+=("$chief_pid")
  local ok=1 t_kill t_restart times=""
  if ! wait_until 120 past_step "$d/chief.err" 300; then
    ok=0; log "recovery: the chief did not pass step 300"
  else
    t_kill=$EPOCHREALTIME
    kill -9 "$ps_pid"; wait "$ps_pid" 2>/dev/null || true
    sleep 0.5
    t_restart=$EPOCHREALTIME
    "$foreman" train "${rmodel[@]}" "${net[@]}" --job-name ps --task-index 0 --ps-join-timeout-secs 600 >"$d/ps2.out" 2>&1 &
    ps_pid=$!; pids+=("$ps_pid")
    if wait_until 60 has_recovered "$d/chief.err"; then
      times=$(recovered_times "$d/chief.err")
    else
      ok=0; log "recovery: no step after a 'Recovered' line within 60 s"
    fi
  fi
  kill -TERM "$chief_pid" 2>/dev/null || true
  wait "$chief_pid" 2>/dev/null || true
  # A chief stopped by SIGTERM is a preempted chief, not the end of
  # training: its ps keeps serving, waiting for it to come back (as TF's
  # server.join()). Stop the ps too, bounded: its first SIGTERM is an
  # eviction that waits up to 5 s for a chief's checkpoint of it; the second
  # exits at once.
  kill -TERM "$ps_pid" 2>/dev/null || true
  sleep 0.1
  kill -TERM "$ps_pid" 2>/dev/null || true
  wait_until 30 gone "$ps_pid" || kill -9 "$ps_pid" 2>/dev/null || true
  wait "$ps_pid" 2>/dev/null || true
  pids=()
  if ((!ok)); then tail -n 20 "$d/chief.err" "$d"/ps*.out >&2; return 1; fi
  local lost
  lost=$(sed -n 's/.*Recovered from a preemption error.* \([0-9]*\) steps lost.*/\1/p' "$d/chief.err" | head -1)
  # shellcheck disable=SC2086
  set -- $times
  awk -v k="$t_kill" -v s="$t_restart" -v a="$1" -v r="$2" -v g="$3" -v l="${lost:-unknown}" \
    'BEGIN { printf "RUN cluster.ps_kill_recovery_s %.3f s recovered_s=%.3f restarted_s=%.3f reachable_s=%.3f restore_s=%.3f steps_lost=%s\n",
             g - k, r - k, s - k, a - k, r - a, l }'
}

log "foreman $foreman, $steps steps per run, $reps repetitions, workers ${worker_counts[*]} (${#cpus[@]} CPUs: a cluster of N workers is pinned, a task per CPU, when N + 1 <= ${#cpus[@]})"
for ((rep = 0; rep < reps; ++rep)); do
  pin_tasks=$((2 <= ${#cpus[@]})); run_single
  for n in "${worker_counts[@]}"; do run_cluster "$n"; done
  for n in "${worker_counts[@]}"; do if ((n == 2)); then run_cluster 2 sync; fi; done
done
for ((rep = 0; rep < recovery_reps; ++rep)); do
  run_recovery
done
