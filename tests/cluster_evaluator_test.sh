#!/usr/bin/env bash
# TF's evaluator task (issue 31 point 6; docs/cluster.md "The evaluator"):
# a TF_CONFIG cluster of a chief, a worker, a ps and an evaluator on
# 127.0.0.1, each `foreman train` told its part by TF_CONFIG only. The
# evaluator starts first (no checkpoint yet: it waits), the chief trains to
# --max-steps with a checkpoint every K steps and --eval-every-steps 7,
# which it must not honour: the evaluator is the one writer of <dir>/eval.
# Checked: every task exits 0; the evaluator exits after evaluating the
# chief's final checkpoint (model.ckpt-F, "training ended at global_step
# F"), in increasing global_step; <dir>/eval (read by `foreman events`)
# holds accuracy exactly at the steps the evaluator printed, F last, and at
# no step of the chief's (the chief says it does not evaluate, and reports
# no test accuracy). Before that, an evaluator alone: its timeout (exit 1)
# and a signal (exit 75), and the last step it waits for: --max-steps, or
# with --epochs the cluster's global steps for them (ClusterStepsForEpochs:
# ceil(epochs x 60000 / batch)), the smaller of the two, as the workers stop.
#
#   cluster_evaluator_test.sh FOREMAN HEARTBEAT_MS CONNECTION_TIMEOUT_MS MAX_STEPS CHECKPOINT_STEPS
set -u
foreman=$1
heartbeat_ms=$2
timeout_ms=$3
max_steps=$4
checkpoint_steps=$5
NAME=cluster_evaluator_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"

unset TF_CONFIG SLURM_PROCID SLURM_NTASKS SLURM_JOB_NODELIST SLURM_STEP_NODELIST SLURM_TASKS_PER_NODE \
  SLURM_STEP_TASKS_PER_NODE

model=(--hidden 16 --batch-size 50 --threads 1 --max-steps "$max_steps" --optimizer adam --seed 7
       --log-step-count-steps 1)
net=(--heartbeat-ms "$heartbeat_ms" --connection-timeout-ms "$timeout_ms")
bound=$(scaled 120)
ckpt=$tmp/run

ports=$(free_ports 4) || { echo "FAIL: cannot find free ports"; exit 1; }
read -r ps_port chief_port worker_port evaluator_port <<<"$ports"
cluster="\"cluster\": {\"chief\": [\"127.0.0.1:$chief_port\"], \"worker\": [\"127.0.0.1:$worker_port\"],
                      \"ps\": [\"127.0.0.1:$ps_port\"], \"evaluator\": [\"127.0.0.1:$evaluator_port\"]}"
tf_config() { echo "{$cluster, \"task\": {\"type\": \"$1\", \"index\": 0}}"; }

# 1. Alone, on a directory no chief writes: no checkpoint within
#    --eval-timeout-secs is exit 1 naming the directory and the wait; a
#    SIGTERM while it waits is exit 75 (stopped, not finished). Neither
#    creates the directory.
out=$(TF_CONFIG=$(tf_config evaluator) timeout "$(scaled 30)" "$foreman" train "${model[@]}" \
      --checkpoint-dir "$tmp/none" --eval-timeout-secs 1 2>&1); code=$?
[[ $code -eq 1 ]] || fail "an evaluator with no checkpoint coming exited $code, expected 1: $out"
has "no new checkpoint in $tmp/none within 1000 ms \(none evaluated yet\) \(--eval-timeout-secs=1\)" "$out" \
  || fail "the evaluator's timeout does not name the directory and the wait: $out"
# The training's last step, from --epochs as the workers count it (not only --max-steps).
epochs_model=(--hidden 16 --batch-size 50 --threads 1 --optimizer adam --seed 7)
for case in "0 2 2400" "5000 1 1200"; do
  read -r case_max case_epochs case_last <<<"$case"
  out=$(TF_CONFIG=$(tf_config evaluator) timeout "$(scaled 30)" "$foreman" train "${epochs_model[@]}" \
        --max-steps "$case_max" --epochs "$case_epochs" --checkpoint-dir "$tmp/none" --eval-timeout-secs 1 2>&1)
  has "^foreman train: the evaluator: evaluating each new checkpoint of $tmp/none .* until global_step $case_last " "$out" \
    || fail "an evaluator with --max-steps $case_max --epochs $case_epochs does not wait for global_step $case_last: $out"
done
TF_CONFIG=$(tf_config evaluator) "$foreman" train "${model[@]}" --checkpoint-dir "$tmp/none" >"$tmp/signalled.out" 2>&1 &
signalled_pid=$!
pids+=("$signalled_pid")
wait_for_line "^foreman train: the evaluator: evaluating" "$tmp/signalled.out" "$bound" "$signalled_pid" \
  || fail "the evaluator to signal did not start: $(cat "$tmp/signalled.out")"
kill -TERM "$signalled_pid" 2>/dev/null
wait_bounded "$signalled_pid" "$bound"
[[ $rc -eq 75 ]] || fail "a signalled evaluator exited $rc, expected 75: $(cat "$tmp/signalled.out")"
has "^evaluator: stopped by a signal after 0 evaluations, not finished \(exit 75\)" "$(cat "$tmp/signalled.out")" \
  || fail "the signalled evaluator does not say it stopped: $(cat "$tmp/signalled.out")"
[[ ! -e $tmp/none ]] || fail "an evaluator created its --checkpoint-dir"

# 2. The cluster.
TF_CONFIG=$(tf_config evaluator) "$foreman" train "${model[@]}" --checkpoint-dir "$ckpt" \
  --eval-timeout-secs "$bound" >"$tmp/evaluator.out" 2>&1 &
evaluator_pid=$!
pids+=("$evaluator_pid")
wait_for_line "^foreman train: the evaluator: evaluating each new checkpoint of $ckpt" "$tmp/evaluator.out" "$bound" \
  "$evaluator_pid" || fail "the evaluator did not start: $(cat "$tmp/evaluator.out")"
TF_CONFIG=$(tf_config ps) "$foreman" train "${model[@]}" "${net[@]}" --ps-join-timeout-secs "$bound" \
  --checkpoint-dir "$tmp/ps_unused" >"$tmp/ps.out" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")
TF_CONFIG=$(tf_config worker) "$foreman" train "${model[@]}" "${net[@]}" --ps-wait-secs "$bound" \
  --checkpoint-dir "$tmp/unused" >"$tmp/worker.out" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
TF_CONFIG=$(tf_config chief) "$foreman" train "${model[@]}" "${net[@]}" --checkpoint-dir "$ckpt" \
  --save-checkpoint-steps "$checkpoint_steps" --eval-every-steps 7 >"$tmp/chief.out" 2>&1 &
chief_pid=$!
pids+=("$chief_pid")

wait_bounded "$chief_pid" "$bound"; chief_rc=$rc
wait_bounded "$worker_pid" "$bound"; worker_rc=$rc
wait_bounded "$ps_pid" "$bound"; ps_rc=$rc
wait_bounded "$evaluator_pid" "$bound"; evaluator_rc=$rc
[[ $chief_rc -eq 0 ]] || fail "the chief exited $chief_rc"
[[ $worker_rc -eq 0 ]] || fail "the worker exited $worker_rc"
[[ $ps_rc -eq 0 ]] || fail "the ps exited $ps_rc"
[[ $evaluator_rc -eq 0 ]] || fail "the evaluator exited $evaluator_rc"

chief=$(cat "$tmp/chief.out")
evaluator=$(cat "$tmp/evaluator.out")
has "^foreman train: the cluster has an evaluator task: the chief does not evaluate" "$chief" \
  || fail "the chief does not say that it leaves the evaluation to the evaluator"
! has "^test accuracy" "$chief" || fail "the chief evaluated although the cluster has an evaluator"
final=$(sed -n 's/^training ended at global_step \([0-9]*\)$/\1/p' "$tmp/chief.out")
[[ $final =~ ^[0-9]+$ ]] || fail "the chief did not say where it ended training"
((final >= max_steps)) || fail "training ended at global_step $final, before --max-steps $max_steps"
has "^checkpoints: $ckpt \(latest: $ckpt/model.ckpt-$final\)" "$chief" \
  || fail "the chief's latest checkpoint is not model.ckpt-$final"

# The evaluator's evaluations, in order; the last is the final checkpoint's.
evaluated=$(sed -n 's/^evaluated model\.ckpt-\([0-9]*\) at global_step \([0-9]*\): accuracy 0\.[0-9]* loss [0-9.]*$/\1 \2/p' \
            "$tmp/evaluator.out")
[[ -n $evaluated ]] || fail "the evaluator printed no evaluation"
# A checkpoint is written at its variables' global_step, which in
# asynchronous training may be past the step in its name (the other
# worker's updates between the chief's read of global_step and its snapshot
# of the ps; TF's evaluator also reports the restored global_step).
steps=()
names=()
while read -r name_step step; do
  ((step >= name_step)) || fail "model.ckpt-$name_step was evaluated at global_step $step, before its name's"
  names+=("$name_step")
  steps+=("$step")
done <<<"$evaluated"
last_name=${names[${#names[@]}-1]:-none}
last=${steps[${#steps[@]}-1]:-none}
[[ $last_name == "$final" && $last == "$final" ]] \
  || fail "the evaluator's last evaluation is of model.ckpt-$last_name at global_step $last, not the final $final"
sorted=$(printf '%s\n' "${steps[@]}" | sort -n -u | tr '\n' ' ')
[[ $sorted == "$(printf '%s ' "${steps[@]}")" ]] || fail "the evaluations are not in increasing global_step: ${steps[*]}"
has "^evaluator: evaluated ${#steps[@]} checkpoints \([0-9]+ skipped\); the last at global_step $final" "$evaluator" \
  || fail "the evaluator's end line does not say it ended at global_step $final"

# One writer: <dir>/eval holds the evaluator's steps and nothing else.
"$foreman" events --tag accuracy "$ckpt/eval" >"$tmp/eval.events" 2>&1 \
  || fail "foreman events failed: $(cat "$tmp/eval.events")"
written=$(sed -n 's/^step \([0-9]*\) .*scalar  accuracy = .*/\1/p' "$tmp/eval.events" | tr '\n' ' ')
[[ $written == "$(printf '%s ' "${steps[@]}")" ]] \
  || fail "$ckpt/eval holds accuracy at steps '$written', the evaluator evaluated '${steps[*]}'"
echo "cluster_evaluator_test: training ended at global_step $final; the evaluator evaluated steps ${steps[*]}"

if ((failures > 0)); then
  for f in "$tmp"/*.out "$tmp"/eval.events; do echo "--- $f:"; cat "$f"; done
  failures_summary
  exit 1
fi
echo "cluster_evaluator_test: OK"
