#!/usr/bin/env bash
# Issue 13 point 8: training throughput of one process vs a cluster on
# 127.0.0.1 (`foreman train` as ps and workers), one intra-op thread per
# process, the main job's model (MLP 784-256-10, Adam, batch 128). The
# configurations alternate within each repetition; every line (report.py's
# runs.txt format) is
#   RUN cluster.<config> <samples/s> samples/s steps_per_sec=.. cpu_ms_per_step=.. [reads=.. read_us=..
#       read_bytes=.. applies=.. apply_us=.. apply_bytes=..]
# where <config> is single, ps1_w1 or ps1_w2 (async). A worker's rate counts
# its own steps from its first step (train.cpp's report); ps1_w2 sums both
# workers'. cpu_ms_per_step: user + system CPU time of all the processes
# (start-up, data loading and the final checkpoint included) over the
# global steps: on a shared machine the wall-clock rates swing with the
# load, the CPU cost much less. The network figures are worker 0's
# PsRemoteValues counters (FOREMAN_CLUSTER_STATS=1, logged at its end): the
# mean wall time of a read (ReadForStep, plus the few full reads) and of an
# apply, and the tensor bytes each carried (payload only, without CAF's
# framing). Sync mode and the ps-kill recovery time are not measured yet.
#
# Usage: tools/bench/cluster_bench.sh FOREMAN_BIN [--steps N] [--reps N] [--data DIR]
# (run.sh --parts 6 runs it with its build and --reps).
set -euo pipefail
foreman=${1:?usage: cluster_bench.sh FOREMAN_BIN [--steps N] [--reps N] [--data DIR]}
shift
steps=2000
reps=3
data=/usr/share/datasets/fashion-mnist
while (($#)); do
  case $1 in
    --steps) steps=$2; shift ;;
    --reps) reps=$2; shift ;;
    --data) data=$2; shift ;;
    *) echo "cluster_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cluster_bench.XXXXXX")
pids=()
cleanup() {
  # Each pid is /usr/bin/time's: its child first.
  for p in "${pids[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
log() { echo "cluster_bench: $*" >&2; }
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
model=(--threads 1 --optimizer adam --batch-size 128 --hidden 256 --seed 0 --data-dir "$data"
       --eval-every-steps 0 --log-step-count-steps 0 --save-checkpoint-secs 3600 --save-summaries-steps 100000)
# "trained N steps in T s (R steps/s, E examples/s)" -> R
rate_of() { sed -n 's/.*trained [0-9]* steps in [0-9.]* s (\([0-9.]*\) steps\/s.*/\1/p' "$1" | tail -1; }
timed() { local f=$1; shift; /usr/bin/time -f '%U %S' -o "$f" "$@"; }  # timed FILE CMD...: CPU seconds into FILE
cpu_of() { awk '{ s += $1 + $2 } END { print s + 0 }' "$@"; }            # user + sys of the FILEs
stats_of() { sed -n 's/.*cluster stats: \(.*\)$/\1/p' "$1" | tail -1; }

run_single() {
  local d=$tmp/single
  rm -rf "$d"; mkdir -p "$d"
  timed "$d/time" timeout 600 "$foreman" train --checkpoint-dir "$d/ckpt" "${model[@]}" --max-steps "$steps" \
    >"$d/out" 2>&1 || { log "single process failed:"; cat "$d/out" >&2; return 1; }
  local r; r=$(rate_of "$d/out")
  awk -v r="$r" -v cpu="$(cpu_of "$d/time")" -v n="$steps" \
    'BEGIN { printf "RUN cluster.single %.0f samples/s steps_per_sec=%.1f cpu_ms_per_step=%.3f\n", r * 128, r, cpu * 1000 / n }'
}

run_cluster() {  # run_cluster WORKERS
  local n=$1 d=$tmp/c$1 ps_port wk=() hosts=() i
  rm -rf "$d"; mkdir -p "$d"
  ps_port=$(free_port)
  for ((i = 0; i < n; ++i)); do wk+=("$(free_port)"); hosts+=("127.0.0.1:${wk[i]}"); done
  local net=(--ps-hosts "127.0.0.1:$ps_port" --worker-hosts "$(IFS=,; echo "${hosts[*]}")")
  timed "$d/ps.time" "$foreman" train "${model[@]}" "${net[@]}" --job-name ps --task-index 0 --ps-join-timeout-secs 600 \
    >"$d/ps.out" 2>&1 &
  local ps_pid=$!; pids+=("$ps_pid")
  local wpids=()
  for ((i = n - 1; i >= 0; --i)); do
    FOREMAN_CLUSTER_STATS=1 timed "$d/w$i.time" timeout 600 "$foreman" train "${model[@]}" "${net[@]}" --job-name worker --task-index "$i" \
      --checkpoint-dir "$d/ckpt$i" --max-steps "$steps" --ps-wait-secs 60 >"$d/w$i.out" 2>&1 &
    wpids+=($!); pids+=($!)
  done
  local ok=1
  for p in "${wpids[@]}"; do wait "$p" || ok=0; done
  wait "$ps_pid" || ok=0
  pids=()
  if ((!ok)); then log "cluster of $n workers failed:"; tail -n 20 "$d"/*.out >&2; return 1; fi
  local total=0 r
  for ((i = 0; i < n; ++i)); do r=$(rate_of "$d/w$i.out"); total=$(awk -v a="$total" -v b="${r:-0}" 'BEGIN { print a + b }'); done
  awk -v r="$total" -v n="$n" -v s="$(stats_of "$d/w0.out")" -v cpu="$(cpu_of "$d"/*.time)" -v steps="$steps" \
    'BEGIN { printf "RUN cluster.ps1_w%d %.0f samples/s steps_per_sec=%.1f cpu_ms_per_step=%.3f %s\n", n, r * 128, r, cpu * 1000 / steps, s }'
}

log "foreman $foreman, $steps steps per run, $reps repetitions"
for ((rep = 0; rep < reps; ++rep)); do
  run_single
  run_cluster 1
  run_cluster 2
done
