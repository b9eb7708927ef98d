#!/usr/bin/env bash
# Runs the three example programs (tools/examples) and checks what they print
# and the checkpoint and event files they leave, reading the files back with
# `foreman inspect` / `foreman events`.
# Usage: examples_test.sh FOREMAN SYNC_TRAINING ACTOR_TRAINING SUPERVISOR_TRAINING FAULT_INJECTION
set -u
foreman=$1
sync_training=$2
actor_training=$3
supervisor_training=$4
fault_injection=$5
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() { grep -Eq -- "$1" <<<"$2"; }
count() { grep -Ec -- "$1" <<<"$2"; }
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/examples_test.XXXXXX") || { echo "cannot create a temporary directory under ${TEST_TMPDIR:-/tmp}" >&2; exit 1; }
trap 'rm -rf "$tmp"' EXIT

# -- synchronous API -------------------------------------------------------------
dir=$tmp/sync
out=$(timeout 120 "$sync_training" "$dir" 200 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "sync_training exited $rc: $out"
has '^runs: 200$' "$out" || fail "sync_training did not run 200 steps: $out"
loss=$(sed -n 's/^final loss: //p' <<<"$out")
[[ -n $loss ]] && awk -v l="$loss" 'BEGIN { exit !(l < 0.001) }' || fail "loss did not converge: '$loss'"
state=$(cat "$dir/checkpoint" 2>/dev/null)
has '^model_checkpoint_path: "model.ckpt-200"$' "$state" || fail "state file: $state"
# Saves at 0 (after_create_session, B103) and every 50 steps (B104); the end
# does not save 200 twice (B105).
for step in 0 50 100 150 200; do
  [[ -f $dir/model.ckpt-$step.index ]] || fail "model.ckpt-$step missing: $(ls "$dir")"
done
[[ $(grep -c '^all_model_checkpoint_paths' <<<"$state") -eq 5 ]] || fail "state file should list 5: $state"
ckpt=$("$foreman" inspect "$dir" --values 2>&1) || fail "inspect: $ckpt"
has '^global_step +int64 +\[\]$' "$ckpt" || fail "inspect: $ckpt"
has '^linear/w +float32 +\[\]$' "$ckpt" || fail "inspect: $ckpt"
events=$("$foreman" events "$dir" 2>&1) || fail "events: $events"
# Summaries at steps 1, 26, ..., 176 (B115: every 25 from a fresh start).
[[ $(count 'scalar  loss = ' "$events") -eq 8 ]] || fail "expected 8 loss summaries: $events"
has '^step 1 .* scalar  loss = ' "$events" || fail "no loss summary at step 1: $events"
has '^step 1 .* session_log  START' "$events" || fail "no START at step 1: $events"
has '^step 200 .* session_log  CHECKPOINT' "$events" || fail "no CHECKPOINT at 200: $events"
has '^step 101 .* scalar  global_step/sec = ' "$events" || fail "no global_step/sec at 101: $events"

# Again on the same directory: restored at 200 = last_step, so no training
# (spec decision 9), and nothing lost.
out=$(timeout 120 "$sync_training" "$dir" 200 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "second sync_training exited $rc: $out"
has '^runs: 0$' "$out" || fail "a finished run trained again: $out"
has 'Restoring parameters from .*model.ckpt-200' "$out" || fail "no restore log line: $out"
# Raising the last step continues from 200.
out=$(timeout 120 "$sync_training" "$dir" 230 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "third sync_training exited $rc: $out"
has '^runs: 30$' "$out" || fail "resume did not run 30 steps: $out"
[[ -f $dir/model.ckpt-230.index ]] || fail "no model.ckpt-230 after resuming: $(ls "$dir")"
# The retention list continued across restarts (B84, H-21): 230 was the 6th,
# so the oldest (0) is gone and 50 is kept.
[[ -f $dir/model.ckpt-0.index ]] && fail "model.ckpt-0 kept beyond max_to_keep 5: $(ls "$dir")"
[[ -f $dir/model.ckpt-50.index ]] || fail "model.ckpt-50 deleted too early: $(ls "$dir")"

# -- actor API -------------------------------------------------------------------
dir=$tmp/actor
out=$(timeout 120 "$actor_training" "$dir" 300 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "actor_training exited $rc: $out"
has '^job state: (running|stopping|idle) \(global_step -?[0-9]+\)$' "$out" || fail "no status reply: $out"
has '^training job finished: OK$' "$out" || fail "outcome: $out"
# The subscriber's typed progress: every 100 global steps from step 1, a
# CheckpointSaved for each save (0, 100, 200 and end()'s 300), JobFinished.
[[ $(count '^progress: global_step (1|101|201) loss [0-9.e+-]+$' "$out") -eq 3 ]] || fail "progress messages: $out"
for step in 0 100 200 300; do
  has "^checkpoint saved: global_step $step .*/model.ckpt-$step\$" "$out" || fail "no CheckpointSaved $step: $out"
done
has '^job finished at global_step 300$' "$out" || fail "no JobFinished: $out"
has '^model_checkpoint_path: "model.ckpt-300"$' "$(cat "$dir/checkpoint" 2>/dev/null)" || fail "actor state file"
[[ -f $dir/model.ckpt-300.index && -f $dir/model.ckpt-100.index ]] || fail "actor checkpoints: $(ls "$dir")"

# -- Supervisor.managed_session: a chief and a worker --------------------------------
dir=$tmp/supervisor
out=$(timeout 120 "$supervisor_training" "$dir" 2000 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "supervisor_training exited $rc: $out"
chief=$(sed -n 's/^chief updates: //p' <<<"$out")
worker=$(sed -n 's/^worker updates: //p' <<<"$out")
final=$(sed -n 's/^global_step: //p' <<<"$out")
# No update was lost: global_step counts every update of both tasks (how
# they share the 2000 is up to the scheduler), and stopped at the last step
# (one past it when both checked it at once).
[[ -n $chief && -n $worker && -n $final ]] || fail "supervisor_training output: $out"
[[ $((chief + worker)) -eq ${final:--1} && ${final:-0} -ge 2000 && ${final:-0} -le 2001 ]] \
  || fail "updates $chief + $worker != global_step $final (or not 2000..2001): $out"
# The chief's services: a checkpoint (the saver fires at once, then every
# 10 minutes) and an event file.
ls "$dir"/model.ckpt-*.index >/dev/null 2>&1 || fail "no chief checkpoint: $(ls "$dir")"
ls "$dir"/events.out.tfevents.* >/dev/null 2>&1 || fail "no chief event file: $(ls "$dir")"

# -- fault injection: a preemption survived in-process, a full disk that ends
# the run, and the restart that resumes without the faults that fired -------------
dir=$tmp/faults
out=$(timeout 120 "$fault_injection" "$dir" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "fault_injection's first run exited $rc, expected 1: $out"
has '^fault fired: preempt at step \(120\)$' "$out" || fail "preempt did not fire at 120: $out"
has '^recovered from ABORTED: .*injected step fault preempt at global_step 120.*: global_step 120 -> 100, 20 steps lost$' \
  "$out" || fail "no in-process recovery from model.ckpt-100: $out"
has '^training failed: RESOURCE_EXHAUSTED: saving the checkpoint of step 150: write .*/model.ckpt-150.data-00000-of-00001.tempstate[0-9]+: No space left on device \(injected fault disk-full\)$' \
  "$out" || fail "the full disk did not end the run naming the file: $out"
has '^caused by injected fault disk-full$' "$out" || fail "the run's error does not carry the fault's id (InjectedFaultId): $out"
has '^model_checkpoint_path: "model.ckpt-100"$' "$(cat "$dir/checkpoint" 2>/dev/null)" \
  || fail "model.ckpt-100 should stay the latest checkpoint: $(cat "$dir/checkpoint" 2>&1)"
compgen -G "$dir/model.ckpt-150*" >/dev/null && fail "a failed save left files: $(ls "$dir")"
record=$(cat "$dir/fault_record.json" 2>&1)
[[ $(grep -c '"id"' <<<"$record") -eq 2 ]] && has '"id": "preempt"' "$record" && has '"id": "disk-full"' "$record" \
  || fail "fault_record.json should list both faults: $record"
out=$(timeout 120 "$fault_injection" "$dir" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "fault_injection's second run exited $rc: $out"
has '^faults fired before: 2$' "$out" || fail "the record was not read back: $out"
has 'Restoring parameters from .*/model.ckpt-100$' "$out" || fail "the rerun did not resume from model.ckpt-100: $out"
has '^fault fired' "$out" && fail "a recorded fault fired again: $out"
has '^runs: 100, recoveries: 0$' "$out" || fail "the rerun should train 100 steps without a recovery: $out"
ckpt=$("$foreman" inspect "$dir" --values 2>&1) || fail "inspect --values (reads every tensor, CRC checked) after the rerun: $ckpt"
has '^model_checkpoint_path: "model.ckpt-200"$' "$(cat "$dir/checkpoint" 2>/dev/null)" \
  || fail "the rerun did not finish at 200: $(cat "$dir/checkpoint" 2>&1)"
# A plan file instead of the built-in plan; a bad one is refused before training.
echo '{"faults": [{"id": "x", "type": "step", "status": "OK", "at_step": 1}]}' >"$tmp/bad_plan.json"
out=$(timeout 60 "$fault_injection" "$tmp/faults2" "$tmp/bad_plan.json" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "a bad plan file exited $rc, expected 2: $out"
has "^error: plan: INVALID_ARGUMENT: $tmp/bad_plan.json: " "$out" || fail "a bad plan file: unclear message: $out"

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "examples OK"
