#!/usr/bin/env bash
# `foreman train` reads its cluster from the environment as launchers give it
# (docs/cluster.md "Kubernetes" and "Slurm"): TF's TF_CONFIG, which Kubeflow's
# TFJob operator writes, and Slurm's SLURM_PROCID / SLURM_NTASKS /
# SLURM_JOB_NODELIST. Each case starts a ps, the chief and a worker on
# 127.0.0.1 with no cluster flag, only the variables this test sets itself;
# once both workers have trained a step the chief gets a SIGTERM and takes
# its final checkpoint (as in cluster_e2e_test.sh), every task exits 0, and
# a single-process `foreman train` without cluster flags or variables
# resumes that checkpoint on the same --checkpoint-dir. Before that: a
# malformed TF_CONFIG or node list, the evaluator's flag misused, and cluster flags
# given with TF_CONFIG (the flags win) are each checked for their exit code
# and message, before anything is created.
#
#   cluster_env_test.sh FOREMAN HEARTBEAT_MS CONNECTION_TIMEOUT_MS [tf_config|slurm|both]
set -u
foreman=$1
heartbeat_ms=$2
timeout_ms=$3
which=${4:-both}
NAME=cluster_env_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"

# No launcher variable of the machine running the test leaks in.
unset TF_CONFIG SLURM_PROCID SLURM_NTASKS SLURM_JOB_NODELIST SLURM_STEP_NODELIST SLURM_TASKS_PER_NODE \
  SLURM_STEP_TASKS_PER_NODE

model=(--hidden 16 --batch-size 50 --threads 1 --max-steps 1000000 --epochs 1000 --optimizer adam --seed 7
       --log-step-count-steps 1 --eval-every-steps 0)
net=(--heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms")
bound=120

# 1. What is refused: exit 2 naming the field and position, nothing created.
expect_refusal() {  # $1 what, $2 regex of the message; the command after
  local what=$1 want=$2 out code
  shift 2
  out=$("$@" 2>&1); code=$?
  [[ $code -eq 2 ]] || fail "$what exited $code, expected 2: $out"
  has "$want" "$out" || fail "$what: the message does not match '$want': $out"
}
good_tf='{"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}, "task": {"type": "chief", "index": 0}}'
expect_refusal "a TF_CONFIG entry that is a number" \
  'TF_CONFIG: cluster.worker\[1\]: expected "host:port", found 5' \
  env TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:2"], "worker": ["127.0.0.1:3", 5]}, "task": {"type": "worker"}}' \
  timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}"
expect_refusal "TF_CONFIG that is not JSON" "TF_CONFIG: not valid JSON at byte 13" \
  env TF_CONFIG='{"cluster": ' timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}"
# The evaluator task runs (cluster_evaluator_test.sh); its flag is its own.
with_evaluator='{"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]},'
expect_refusal "--eval-timeout-secs for the chief" \
  "--eval-timeout-secs is the evaluator task's \(TF_CONFIG task.type evaluator\); this process is worker task 0" \
  env TF_CONFIG="$with_evaluator \"task\": {\"type\": \"chief\", \"index\": 0}}" \
  timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}" --eval-timeout-secs 5
expect_refusal "an evaluator with --eval-timeout-secs 0" "--eval-timeout-secs must be in \[1, 31536000\], got 0" \
  env TF_CONFIG="$with_evaluator \"task\": {\"type\": \"evaluator\", \"index\": 0}}" \
  timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}" --eval-timeout-secs 0
expect_refusal "an evaluator task index 1" "TF_CONFIG: task.index: 1 is out of range for cluster.evaluator" \
  env TF_CONFIG="$with_evaluator \"task\": {\"type\": \"evaluator\", \"index\": 1}}" \
  timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}"
expect_refusal "an unclosed '[' in SLURM_STEP_NODELIST" "SLURM_STEP_NODELIST: position 7: unclosed '\['" \
  env SLURM_PROCID=0 SLURM_NTASKS=3 SLURM_STEP_NODELIST='a,node[1-2' SLURM_JOB_NODELIST='a,node[1-2]' \
  timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}"
expect_refusal "an unclosed '[' in SLURM_JOB_NODELIST (--cluster-env slurm)" \
  "SLURM_JOB_NODELIST: position 7: unclosed '\['" \
  env SLURM_PROCID=0 SLURM_NTASKS=3 SLURM_JOB_NODELIST='a,node[1-2' \
  timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}" --cluster-env slurm
expect_refusal "--slurm-ps-tasks with TF_CONFIG" "--slurm-ps-tasks is for a cluster read from Slurm" \
  env TF_CONFIG="$good_tf" timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}" --slurm-ps-tasks 2
expect_refusal "--cluster-env tf_config without TF_CONFIG" "TF_CONFIG is not set" \
  timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}" --cluster-env tf_config
# The flags win: with a TF_CONFIG that would fail, the flags' own error
# (a --task-index out of range) is the one reported, with a note.
out=$(TF_CONFIG='{"broken' timeout 30 "$foreman" train --checkpoint-dir "$tmp/bad" "${model[@]}" \
      --ps-hosts 127.0.0.1:2 --worker-hosts 127.0.0.1:3 --job-name worker --task-index 1 2>&1); code=$?
[[ $code -eq 2 ]] || fail "flags with TF_CONFIG set exited $code, expected 2: $out"
has "--task-index 1 is out of range" "$out" || fail "the flags did not win over TF_CONFIG: $out"
has "TF_CONFIG is set but ignored" "$out" || fail "no note that TF_CONFIG was ignored: $out"
! has "TF_CONFIG: " "$out" || fail "TF_CONFIG was read although the flags were given: $out"
[[ ! -e $tmp/bad ]] || fail "a refused start created its --checkpoint-dir"

# 2. A cluster of three tasks, each told its part only by `envs[i]` (an
#    `env` argument list), trained until both workers step, then SIGTERM to
#    the chief; then a single-process resume. $1 names the case; envs[0] is
#    the ps, envs[1] the chief, envs[2] the other worker.
run_cluster() {
  local name=$1 ckpt=$tmp/$1/run
  mkdir -p "$tmp/$name"
  local ps_out=$tmp/$name/ps.out chief_out=$tmp/$name/chief.out worker_out=$tmp/$name/worker.out
  env "${env_ps[@]}" "$foreman" train "${model[@]}" "${net[@]}" --ps-join-timeout-secs "$bound" \
    --checkpoint-dir "$tmp/$name/ps_unused" >"$ps_out" 2>&1 &
  local ps_pid=$!
  pids+=("$ps_pid")
  env "${env_worker[@]}" "$foreman" train "${model[@]}" "${net[@]}" --ps-wait-secs "$bound" \
    --checkpoint-dir "$tmp/$name/unused" >"$worker_out" 2>&1 &
  local worker_pid=$!
  pids+=("$worker_pid")
  wait_for_line "^foreman train: worker 1 of 2" "$worker_out" "$bound" "$worker_pid" \
    || fail "$name: the worker did not start as worker 1: $(cat "$worker_out")"
  env "${env_chief[@]}" "$foreman" train "${model[@]}" "${net[@]}" --checkpoint-dir "$ckpt" \
    --save-checkpoint-secs 600 --signal-ends-training >"$chief_out" 2>&1 &
  local chief_pid=$!
  pids+=("$chief_pid")
  wait_for_line "^step [0-9]+" "$chief_out" "$bound" "$chief_pid" || fail "$name: the chief trained no step"
  wait_for_line "^step [0-9]+" "$worker_out" "$bound" "$worker_pid" || fail "$name: the worker trained no step"
  kill -TERM "$chief_pid" 2>/dev/null
  local chief_rc worker_rc ps_rc
  wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
  wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
  wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
  [[ $chief_rc -eq 0 ]] || fail "$name: the chief exited $chief_rc: $(cat "$chief_out")"
  [[ $worker_rc -eq 0 ]] || fail "$name: the worker exited $worker_rc: $(cat "$worker_out")"
  [[ $ps_rc -eq 0 ]] || fail "$name: the ps exited $ps_rc: $(cat "$ps_out")"
  has "^foreman train: the cluster from $from_ps: ps task 0 of " "$(cat "$ps_out")" \
    || fail "$name: the ps does not say where its cluster came from: $(cat "$ps_out")"
  has "^foreman train: the cluster from $from_chief: worker task 0 of " "$(cat "$chief_out")" \
    || fail "$name: the chief does not say where its cluster came from: $(cat "$chief_out")"
  has "^foreman train: the chief \(worker 0 of 2" "$(cat "$chief_out")" \
    || fail "$name: the chief did not run as worker 0 of 2: $(cat "$chief_out")"
  has "^ps task 0: training ended" "$(cat "$ps_out")" || fail "$name: the ps did not see training end"
  local final
  final=$(sed -n 's/^training ended at global_step \([0-9]*\)$/\1/p' "$chief_out")
  if [[ ! $final =~ ^[0-9]+$ ]]; then
    fail "$name: the chief did not say where it ended training: $(cat "$chief_out")"
    return
  fi
  has "^checkpoints: $ckpt \(latest: $ckpt/model.ckpt-$final\)" "$(cat "$chief_out")" \
    || fail "$name: the chief's latest checkpoint is not model.ckpt-$final: $(cat "$chief_out")"
  [[ ! -e $tmp/$name/unused && ! -e $tmp/$name/ps_unused ]] || fail "$name: the worker or the ps created a directory"
  # One process, no cluster: resumes the cluster's checkpoint.
  out=$(timeout "$bound" "$foreman" train --checkpoint-dir "$ckpt" --max-steps "$((final + 5))" 2>&1); code=$?
  [[ $code -eq 0 ]] || fail "$name: the single-process resume exited $code: $out"
  has "Restoring parameters from $ckpt/model.ckpt-$final" "$out" \
    || fail "$name: the single-process resume did not restore model.ckpt-$final: $out"
  has "^trained 5 steps" "$out" || fail "$name: the single-process resume did not train 5 steps: $out"
  echo "$name: training ended at global_step $final; one process resumed it to $((final + 5))"
}

if [[ $which == tf_config || $which == both ]]; then
  # TF_CONFIG as Kubeflow's TFJob operator writes it for Chief, Worker and
  # PS replicas; TF's worker 0 is Foreman's worker 1.
  ports=$(free_ports 3) || { echo "FAIL: cannot find free ports"; exit 1; }
  read -r ps_port chief_port worker_port <<<"$ports"
  cluster="\"cluster\": {\"chief\": [\"127.0.0.1:$chief_port\"], \"worker\": [\"127.0.0.1:$worker_port\"],
                        \"ps\": [\"127.0.0.1:$ps_port\"]}, \"environment\": \"cloud\""
  env_ps=(TF_CONFIG="{$cluster, \"task\": {\"type\": \"ps\", \"index\": 0}}")
  env_chief=(TF_CONFIG="{$cluster, \"task\": {\"type\": \"chief\", \"index\": 0}}")
  env_worker=(TF_CONFIG="{$cluster, \"task\": {\"type\": \"worker\", \"index\": 0}}")
  from_ps="TF_CONFIG task ps 0"
  from_chief="TF_CONFIG task chief 0"
  run_cluster tf_config
fi

if [[ $which == slurm || $which == both ]]; then
  # An srun step of 3 tasks on one node (the variables srun gives each
  # task): rank 0 the ps, rank 1 the chief, rank 2 worker 1, on
  # --slurm-base-port + rank.
  base=$(free_port_run 3) || { echo "FAIL: cannot find 3 consecutive free ports"; exit 1; }
  slurm=(SLURM_NTASKS=3 SLURM_JOB_NODELIST=127.0.0.1 SLURM_TASKS_PER_NODE=3 SLURM_STEP_NODELIST=127.0.0.1
         SLURM_STEP_TASKS_PER_NODE=3)
  model+=(--slurm-base-port "$base")
  env_ps=("${slurm[@]}" SLURM_PROCID=0)
  env_chief=("${slurm[@]}" SLURM_PROCID=1)
  env_worker=("${slurm[@]}" SLURM_PROCID=2)
  from_ps="SLURM_PROCID 0 of SLURM_NTASKS 3"
  from_chief="SLURM_PROCID 1 of SLURM_NTASKS 3"
  run_cluster slurm
fi

if ((failures > 0)); then
  for f in "$tmp"/*/*.out; do echo "--- $f:"; cat "$f"; done
  failures_summary
  exit 1
fi
echo "cluster_env_test: OK"
