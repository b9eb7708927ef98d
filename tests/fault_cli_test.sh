#!/usr/bin/env bash
# `foreman train --fault-plan` as `foreman chaos` drives it (docs/train.md
# "Faults in foreman train"): a bad plan or fault record is exit 2 before
# anything is written, and every JSON plan of the docs is accepted; a step
# ABORTED is recovered in the process and ends with the fault-free weights;
# a SIGKILL process fault is recorded before it kills (exit 137) and the
# rerun of the same command resumes without firing it again and ends with
# the fault-free weights, bit for bit; ENOSPC on a checkpoint's data file
# (and on its index, written through LevelDB) ends the run with exit 3
# naming the fault, the previous checkpoint
# intact, and the rerun finishes; a NaN-loss fault, a hook that throws and
# an EIO reading the data before training, a killed service (the input
# pipeline's producer among them: its rerun resumes with the fault-free
# weights) and an INTERNAL step fault are exit 3 too; the
# docs' plan run as a supervisor would (SIGTERM: a graceful stop, exit 0;
# an fsync: exit 3; SIGKILL: 137; then done, with the fault-free weights).
# Small runs on the real Fashion-MNIST (Debian: dataset-fashion-mnist).
#
#   fault_cli_test.sh FOREMAN TOOLS_TESTING_DIR DOCS_DIR [FULL]
# FULL=1 (the release build, the default) runs every case; FULL=0 (the
# sanitizer builds, where each training run is ~30x slower) only the plan and
# record refusals, the reference run and the central property: a SIGKILL
# recorded before it kills, and the rerun that does not fire it again and
# ends with the fault-free weights.
set -u
foreman=$1
tools=$2
docs=$3
full=${4:-1}
data=/usr/share/datasets/fashion-mnist
py=/usr/bin/python3
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() { grep -Eq -- "$1" <<<"$2"; }
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/fault_cli_test.XXXXXX") || { echo "cannot create a temporary directory under ${TEST_TMPDIR:-/tmp}" >&2; exit 1; }
trap 'rm -rf "$tmp"' EXIT

if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  echo "FAIL: $data is missing: install Debian's dataset-fashion-mnist (tools/scripts/install-deps.sh)"
  exit 1
fi

steps=200
small=(--max-steps "$steps" --hidden 32 --batch-size 32 --threads 1 --save-checkpoint-steps 20
       --save-summaries-steps 20 --log-step-count-steps 20 --eval-every-steps 0)
# Every run is bounded; a run's output is in $out, its exit status in $rc.
train() { out=$(timeout 300 "$foreman" train "$@" 2>&1); rc=$?; }
plan() { printf '%s\n' "$2" >"$tmp/$1.json"; }
# The ids, paths and op_indexes of <dir>/fault_record.json, one "id path op_index" a line.
record() {
  "$py" -c 'import json, sys
for f in json.load(open(sys.argv[1]))["fired"]: print(f["id"], f["path"], f["op"], f["op_index"])' "$1/fault_record.json"
}
# The step of the checkpoint <dir>/checkpoint lists as the latest.
latest_step() { sed -n 's/^model_checkpoint_path: "model.ckpt-\([0-9]*\)"$/\1/p' "$1/checkpoint" 2>/dev/null; }
same_as_ref() {  # <dir> <what>: valid files and bitwise the reference's weights at $steps
  local check
  check=$("$py" -B "$tools/check_train_run.py" "$1" --step "$steps" --hidden 32 --batch-size 32 --same-as "$tmp/ref" 2>&1) \
    || fail "$2: not bitwise the fault-free weights at step $steps: $check"
}

# 1. --help names the flag.
has "--fault-plan" "$("$foreman" train --help 2>&1)" || fail "foreman train --help does not list --fault-plan"

# 2. Bad plans: exit 2, the parser's message, nothing written.
plan syntax '{"faults": [}'
plan type '{"faults": [{"id": "x", "type": "disk", "nth": 1}]}'
plan crash '{"faults": [{"id": "power-cut", "type": "env", "kind": "crash", "nth": 3}]}'
plan signal '{"faults": [{"id": "k", "type": "process", "signal": "SIGINT", "at_step": 3}]}'
plan lock '{"faults": [{"id": "lk", "type": "env", "op": "lock", "error": "EIO", "nth": 1}]}'
for bad in "syntax:$tmp/syntax.json: not valid JSON at byte" \
           "type:faults\[0\] \(\"x\"\): \"type\" must be one of env, step, hook, process" \
           "crash:fault \"power-cut\": kind crash simulates a power cut.*use a process fault instead" \
           "signal:\"signal\" must be \"SIGKILL\" or \"SIGTERM\", got \"SIGINT\"" \
           "lock:fault \"lk\": op lock: foreman train takes its directory's lock before any fault applies" \
           "missing:$tmp/missing.json"; do
  name=${bad%%:*}
  train --checkpoint-dir "$tmp/bad-$name" --fault-plan "$tmp/$name.json" "${small[@]}"
  [[ $rc -eq 2 ]] || fail "plan $name: exit $rc, expected 2: $out"
  has "^foreman train: bad fault plan: .*${bad#*:}" "$out" || fail "plan $name: message: $out"
  [[ ! -e $tmp/bad-$name ]] || fail "plan $name: the refused start created $tmp/bad-$name"
done

# 3. Every JSON plan in the docs is accepted: the start gets past the plan
#    and the record, and is refused only for the (missing) data.
"$py" - "$docs/fault-injection.md" "$docs/train.md" "$tmp" <<'EOF' || fail "cannot extract the docs' JSON plans"
import re, sys
n = 0
for doc in sys.argv[1:-1]:
    for block in re.findall(r"^```json\n(.*?)^```$", open(doc, encoding="utf-8").read(), re.S | re.M):
        n += 1
        open(f"{sys.argv[-1]}/doc-plan-{n}.json", "w").write(block)
sys.exit(0 if n >= 2 else 1)
EOF
for p in "$tmp"/doc-plan-*.json; do
  train --checkpoint-dir "$tmp/doc-run" --fault-plan "$p" --data-dir "$tmp/no-data" "${small[@]}"
  [[ $rc -eq 2 ]] && has "^foreman train: cannot load the data" "$out" \
    || fail "the docs' plan $(cat "$p") was not accepted (exit $rc): $out"
done

# 4. The fault-free reference, with --run-record (no plan): the file gets
#    one step event per step and the exit, the directory no run record.
train --checkpoint-dir "$tmp/ref" --run-record "$tmp/ref-record.jsonl" "${small[@]}"
[[ $rc -eq 0 ]] || fail "the reference run exited $rc: $out"
[[ ! -e $tmp/ref/fault_record.json ]] || fail "a run without --fault-plan wrote a fault record"
[[ ! -e $tmp/ref/run_record.jsonl ]] || fail "--run-record FILE also wrote the directory's run_record.jsonl"
events=$("$py" -c 'import json, sys
e = [json.loads(l) for l in open(sys.argv[1])]
steps = [x["global_step"] for x in e if x["event"] == "step"]
print(len(steps), steps[0] if steps else -1, steps[-1] if steps else -1, e[-1]["event"] if e else "none")' \
  "$tmp/ref-record.jsonl" 2>&1)
[[ $events == "$steps 1 $steps exit" ]] || fail "--run-record: want '$steps 1 $steps exit' (steps, first, last, last event), got '$events'"
# A ps task trains nothing: --run-record there is exit 2 before it serves.
train --ps-hosts 127.0.0.1:1 --worker-hosts 127.0.0.1:2 --job-name ps --task-index 0 \
  --checkpoint-dir "$tmp/ps" --run-record "$tmp/ps.jsonl"
[[ $rc -eq 2 ]] && has "--run-record is for a training task; a ps task trains nothing" "$out" \
  || fail "--run-record on a ps: exit $rc: $out"
[[ ! -e $tmp/ps.jsonl ]] || fail "a refused ps task wrote its run record"

# 5. A corrupt record is exit 2 naming it.
mkdir -p "$tmp/corrupt" && echo '{"fired": 3}' >"$tmp/corrupt/fault_record.json"
plan preempt '{"faults": [{"id": "preempt", "type": "step", "status": "ABORTED", "at_step": 50}]}'
train --checkpoint-dir "$tmp/corrupt" --fault-plan "$tmp/preempt.json" "${small[@]}"
[[ $rc -eq 2 ]] || fail "a corrupt record: exit $rc, expected 2: $out"
has "^foreman train: bad fault record: $tmp/corrupt/fault_record.json: not a valid fault record" "$out" \
  || fail "a corrupt record: message: $out"

if ((full)); then
# 6. ABORTED at step 50: recovered in the process from model.ckpt-40, exit 0,
#    the fault-free weights; logged at WARNING and recorded.
d=$tmp/aborted
train --checkpoint-dir "$d" --fault-plan "$tmp/preempt.json" "${small[@]}"
[[ $rc -eq 0 ]] || fail "ABORTED at 50: exit $rc, expected 0: $out"
has "\[W\] injected fault preempt fired at global_step 50 \(step returns ABORTED\)" "$out" \
  || fail "ABORTED at 50: no warning on stderr: $out"
grep -q "\[W\] injected fault preempt fired at global_step 50" "$d/train.log" || fail "ABORTED at 50: no warning in train.log"
has "Restoring parameters from $d/model.ckpt-40" "$out" || fail "ABORTED at 50: no recovery from model.ckpt-40: $out"
[[ $(record "$d") == "preempt step any 50" ]] || fail "ABORTED at 50: the record is '$(record "$d")'"
same_as_ref "$d" "ABORTED at 50"
fi

# 7. SIGKILL at step 130: recorded before the kill (exit 137); the same
#    command again resumes from the last checkpoint, does not fire it again
#    and ends with the fault-free weights.
d=$tmp/killed
plan kill '{"faults": [{"id": "kill", "type": "process", "signal": "SIGKILL", "at_step": 130}]}'
train --checkpoint-dir "$d" --fault-plan "$tmp/kill.json" "${small[@]}"
[[ $rc -eq 137 ]] || fail "SIGKILL at 130: exit $rc, expected 137: $out"
[[ $(record "$d") == "kill process any 130" ]] || fail "SIGKILL at 130: the record is '$(record "$d")'"
grep -q "\[W\] injected fault kill fired at global_step 130 (SIGKILL to this process)" "$d/train.log" \
  || fail "SIGKILL at 130: no warning in train.log: $(tail -3 "$d/train.log")"
# Under a plan every save is durable before the next step: the kill finds model.ckpt-120 committed.
killed_at=$(latest_step "$d")
[[ $killed_at == 120 ]] || fail "SIGKILL at 130: the latest checkpoint is '$killed_at', not 120"
train --checkpoint-dir "$d" --fault-plan "$tmp/kill.json" "${small[@]}"
[[ $rc -eq 0 ]] || fail "SIGKILL's rerun: exit $rc, expected 0: $out"
has "Restoring parameters from $d/model.ckpt-$killed_at" "$out" || fail "SIGKILL's rerun did not restore model.ckpt-$killed_at: $out"
has "^trained $((steps - killed_at)) steps" "$out" || fail "SIGKILL's rerun should train $((steps - killed_at)) steps: $out"
has "injected fault" "$out" && fail "SIGKILL's rerun fired a fault again: $out"
[[ $(record "$d") == "kill process any 130" ]] || fail "SIGKILL's rerun changed the record: '$(record "$d")'"
same_as_ref "$d" "SIGKILL at 130, rerun"

if ((full)); then
# 7b. A process fault by time ("at_time_ms": 0: the first run) on the real clock.
plan early '{"faults": [{"id": "early", "type": "process", "signal": "SIGKILL", "at_time_ms": 0}]}'
train --checkpoint-dir "$tmp/early" --fault-plan "$tmp/early.json" "${small[@]}"
[[ $rc -eq 137 ]] || fail "SIGKILL at 0 ms: exit $rc, expected 137: $out"
[[ $(record "$tmp/early") == "early process any 0" ]] || fail "SIGKILL at 0 ms: the record is '$(record "$tmp/early")'"

# 8. ENOSPC appending model.ckpt-60's data file: exit 3 naming the fault,
#    model.ckpt-40 still the latest and intact; the rerun finishes.
d=$tmp/full
plan full '{"faults": [{"id": "disk-full", "type": "env", "path": "*/model.ckpt-60.data-*", "op": "append", "error": "ENOSPC", "nth": 1}]}'
train --checkpoint-dir "$d" --fault-plan "$tmp/full.json" "${small[@]}"
[[ $rc -eq 3 ]] || fail "ENOSPC: exit $rc, expected 3: $out"
[[ $(tail -n 1 <<<"$out") =~ ^"foreman train: stopped by injected fault disk-full: RESOURCE_EXHAUSTED: ".*"No space left on device (injected fault disk-full)"$ ]] \
  || fail "ENOSPC: the last line: $(tail -n 1 <<<"$out")"
has "\[W\] injected fault disk-full fired at append $d/model.ckpt-60.data-00000-of-00001 \(operation 1\)" "$out" \
  || fail "ENOSPC: no warning naming the op and path: $out"
[[ $(latest_step "$d") == 40 ]] || fail "ENOSPC: the latest checkpoint is '$(latest_step "$d")', not 40"
"$py" -B -c 'import sys; sys.path.insert(0, sys.argv[1]); import tfformat as tf
b = tf.read_bundle(sys.argv[2]); sys.exit(0 if b.tensors["global_step"].values == [40] else 1)' "$tools" "$d/model.ckpt-40" \
  || fail "ENOSPC: model.ckpt-40 does not read back (every CRC) at global_step 40"
train --checkpoint-dir "$d" --fault-plan "$tmp/full.json" "${small[@]}"
[[ $rc -eq 0 ]] || fail "ENOSPC's rerun: exit $rc, expected 0: $out"
has "Restoring parameters from $d/model.ckpt-40" "$out" || fail "ENOSPC's rerun did not restore model.ckpt-40: $out"
same_as_ref "$d" "ENOSPC at 60, rerun"

# 8a. ENOSPC appending model.ckpt-20's index (written by LevelDB's table
#     builder, whose own error type has no code or payload): the same as
#     on the data file, exit 3 naming the fault, RESOURCE_EXHAUSTED, the Env's
#     message (not LevelDB's "IO error: ..."); model.ckpt-0 stays the latest.
d=$tmp/index-full
plan index-full '{"faults": [{"id": "idx", "type": "env", "path": "*/model.ckpt-20.index*", "op": "append", "error": "ENOSPC", "nth": 1}]}'
train --checkpoint-dir "$d" --fault-plan "$tmp/index-full.json" "${small[@]}"
[[ $rc -eq 3 ]] || fail "ENOSPC on the index: exit $rc, expected 3: $out"
[[ $(tail -n 1 <<<"$out") =~ ^"foreman train: stopped by injected fault idx: RESOURCE_EXHAUSTED: ".*": write $d/model.ckpt-20.index.tempstate"[0-9]+": No space left on device (injected fault idx)"$ ]] \
  || fail "ENOSPC on the index: the last line: $(tail -n 1 <<<"$out")"
has "IO error" "$out" && fail "ENOSPC on the index: LevelDB's message instead of the Env's: $out"
[[ $(latest_step "$d") == 0 ]] || fail "ENOSPC on the index: the latest checkpoint is '$(latest_step "$d")', not 0"

# 9. A NaN loss at step 30: NanTensorHook fails the run; exit 3 naming the fault.
plan nan '{"faults": [{"id": "nan", "type": "step", "nan_loss": true, "at_step": 30}]}'
train --checkpoint-dir "$tmp/nan" --fault-plan "$tmp/nan.json" "${small[@]}"
[[ $rc -eq 3 ]] || fail "NaN loss: exit $rc, expected 3: $out"
has "^foreman train: stopped by injected fault nan: INTERNAL: .*NaN loss during training" "$out" || fail "NaN loss: message: $out"

# 9a. A NaN-loss fault on a fetch foreman train does not request would never
#     fire: refused (exit 2) naming the field.
plan nanname '{"faults": [{"id": "nn", "type": "step", "nan_loss": true, "loss_tensor": "nope", "at_step": 10}]}'
train --checkpoint-dir "$tmp/nanname" --fault-plan "$tmp/nanname.json" "${small[@]}"
[[ $rc -eq 2 ]] || fail "nan_loss on an unknown fetch: exit $rc, expected 2: $out"
has "fault \"nn\": \"loss_tensor\" must be \"loss\"" "$out" || fail "nan_loss on an unknown fetch: message: $out"

# 9b. A hook that throws, and an EIO reading the training data (before
#     training starts: not exit 2, which says "do not restart"): exit 3.
plan hook '{"faults": [{"id": "hook-throws", "type": "hook", "callback": "after_run", "at_step": 30}]}'
train --checkpoint-dir "$tmp/hook" --fault-plan "$tmp/hook.json" "${small[@]}"
[[ $rc -eq 3 ]] || fail "hook fault: exit $rc, expected 3: $out"
[[ $(tail -n 1 <<<"$out") == "foreman train: stopped by injected fault hook-throws: INTERNAL: hook FaultInjectionHook::after_run: injected hook fault hook-throws at global_step 30" ]] \
  || fail "hook fault: the last line: $(tail -n 1 <<<"$out")"
plan data '{"faults": [{"id": "data-eio", "type": "env", "path": "*/train-images-idx3-ubyte.gz", "op": "read", "nth": 1}]}'
train --checkpoint-dir "$tmp/data" --fault-plan "$tmp/data.json" "${small[@]}"
[[ $rc -eq 3 ]] || fail "EIO reading the data: exit $rc, expected 3: $out"
has "^foreman train: stopped by injected fault data-eio: INTERNAL: read $data/train-images-idx3-ubyte.gz: Input/output error \(injected fault data-eio\)$" "$out" \
  || fail "EIO reading the data: message: $out"
[[ $(record "$tmp/data") == "data-eio $data/train-images-idx3-ubyte.gz read 1" ]] \
  || fail "EIO reading the data: the record is '$(record "$tmp/data")'"

# 9d. A killed service (the checkpoint saver, under TF's default policy) and
#     an INTERNAL step fault: exit 3 naming the fault, known by the error's
#     injected-fault payload (the kill's exit reason crosses the actors).
plan kill '{"faults": [{"id": "kill-saver", "type": "actor", "service": "checkpoint_saver", "at_step": 30}]}'
train --checkpoint-dir "$tmp/kill" --fault-plan "$tmp/kill.json" "${small[@]}"
[[ $rc -eq 3 ]] || fail "actor kill: exit $rc, expected 3: $out"
has "^foreman train: stopped by injected fault kill-saver: INTERNAL: injected actor fault kill-saver$" "$out" \
  || fail "actor kill: message: $out"
plan internal '{"faults": [{"id": "step-internal", "type": "step", "status": "INTERNAL", "message": "boom", "at_step": 30}]}'
train --checkpoint-dir "$tmp/internal" --fault-plan "$tmp/internal.json" "${small[@]}"
[[ $rc -eq 3 ]] || fail "INTERNAL step fault: exit $rc, expected 3: $out"
has "^foreman train: stopped by injected fault step-internal: INTERNAL: .*injected step fault step-internal at global_step 30: boom$" "$out" \
  || fail "INTERNAL step fault: message: $out"

# 9c. A stat that fails (EACCES) on the settings file of a finished run is
#     that error (exit 3, the fault named), not "no train_settings.txt" (a
#     refusal as another program's directory); the rerun resumes.
cp -r "$tmp/ref" "$tmp/statted" && rm -f "$tmp/statted/fault_record.json"
plan stat '{"faults": [{"id": "stat", "type": "env", "path": "*train_settings*", "op": "stat", "error": "EACCES", "nth": 1}]}'
train --checkpoint-dir "$tmp/statted" --fault-plan "$tmp/stat.json" "${small[@]/#$steps/260}"
[[ $rc -eq 3 ]] || fail "EACCES on stat of train_settings.txt: exit $rc, expected 3: $out"
has "^foreman train: stopped by injected fault stat: PERMISSION_DENIED: " "$out" \
  || fail "EACCES on stat of train_settings.txt: message: $out"
has "did not write" "$out" && fail "EACCES on stat of train_settings.txt: taken for a missing file: $out"
train --checkpoint-dir "$tmp/statted" --fault-plan "$tmp/stat.json" "${small[@]/#$steps/260}"
[[ $rc -eq 0 ]] && has "Restoring parameters from $tmp/statted/model.ckpt-200" "$out" \
  || fail "EACCES on stat: the rerun did not resume from model.ckpt-200 (exit $rc): $out"

# 9d. An actor fault that kills the input pipeline's producer at step 70
#     (TF's default policy): exit 3 naming the fault, model.ckpt-60 the
#     latest; the rerun resumes from it, does not fire it again and ends
#     with the fault-free weights.
d=$tmp/input-killed
plan input '{"faults": [{"id": "kill-input", "type": "actor", "service": "input_pipeline", "kind": "kill", "at_step": 70}]}'
train --checkpoint-dir "$d" --fault-plan "$tmp/input.json" "${small[@]}"
[[ $rc -eq 3 ]] || fail "input pipeline killed at 70: exit $rc, expected 3: $out"
[[ $(tail -n 1 <<<"$out") == "foreman train: stopped by injected fault kill-input: INTERNAL: injected actor fault kill-input" ]] \
  || fail "input pipeline killed at 70: the last line: $(tail -n 1 <<<"$out")"
[[ $(record "$d") == "kill-input actor:input_pipeline any 70" ]] || fail "input pipeline killed at 70: the record is '$(record "$d")'"
[[ $(latest_step "$d") == 60 ]] || fail "input pipeline killed at 70: the latest checkpoint is '$(latest_step "$d")', not 60"
train --checkpoint-dir "$d" --fault-plan "$tmp/input.json" "${small[@]}"
[[ $rc -eq 0 ]] || fail "input pipeline killed at 70, rerun: exit $rc, expected 0: $out"
has "Restoring parameters from $d/model.ckpt-60" "$out" || fail "input pipeline killed, rerun: no restore of model.ckpt-60: $out"
has "injected fault" "$out" && fail "input pipeline killed, rerun: fired a fault again: $out"
same_as_ref "$d" "input pipeline killed at 70, rerun"

# 9e. A service gone for good after a kill ends the run at once with the
#     kill's fault id (exit 3): a save to a checkpoint saver the policy
#     removed is FAILED_PRECONDITION, not UNAVAILABLE (which would be
#     recovered from ten times, ~100 s, then exit 1); under TF's default a
#     normal exit of the summary writer or the input pipeline fails the run
#     "not running" carrying the fault id (a normal exit has no payload).
plan removed-saver '{"faults": [{"id": "kill-saver-at-50", "type": "actor", "service": "checkpoint_saver", "at_step": 50}]}'
train --checkpoint-dir "$tmp/removed-saver" --fault-plan "$tmp/removed-saver.json" "${small[@]}" \
  --restart-policy checkpoint_saver=temporary,max_restarts=2
[[ $rc -eq 3 ]] || fail "a save to a removed saver: exit $rc, expected 3: $out"
has "^foreman train: stopped by injected fault kill-saver-at-50: FAILED_PRECONDITION: .*checkpoint_saver\(.*\) is not running: removed by the session's restart policy" "$out" \
  || fail "a save to a removed saver: message: $out"
has "Recovered from a preemption error" "$out" && fail "a save to a removed saver: recovered from: $out"
for service in summary_writer input_pipeline; do
  plan "quiet-$service" "{\"faults\": [{\"id\": \"quiet-$service\", \"type\": \"actor\", \"service\": \"$service\", \"exit_normally\": true, \"at_step\": 50}]}"
  train --checkpoint-dir "$tmp/quiet-$service" --fault-plan "$tmp/quiet-$service.json" "${small[@]}"
  [[ $rc -eq 3 ]] || fail "$service killed with a normal exit: exit $rc, expected 3: $out"
  has "^foreman train: stopped by injected fault quiet-$service: FAILED_PRECONDITION: " "$out" \
    || fail "$service killed with a normal exit: message: $out"
done

# 10. docs/fault-injection.md's "Faults in foreman train" plan, as a
#     supervisor runs it: the same command after every exit until it trains
#     to the end: exits 0 (SIGTERM), 3 (fsync), 137 (SIGKILL), 0; the
#     fault-free weights.
doc_plan=$(grep -l '"index-fsync"' "$tmp"/doc-plan-*.json | head -n 1)
d=$tmp/supervised
codes=()
for ((i = 0; i < 6; i++)); do
  train --checkpoint-dir "$d" --fault-plan "$doc_plan" "${small[@]}"
  codes+=("$rc")
  if ((i == 0)); then  # SIGTERM at step 70: the graceful stop at the end of that step, a final checkpoint at 71
    has "^stopped by SIGTERM after its final checkpoint" "$out" || fail "the docs' plan: SIGTERM was not a graceful stop: $out"
    [[ $(latest_step "$d") == 71 ]] || fail "the docs' plan: SIGTERM's final checkpoint is '$(latest_step "$d")', not 71"
  fi
  [[ $rc -eq 0 ]] && ! has "^stopped by" "$out" && break
done
[[ "${codes[*]}" == "0 3 137 0" ]] || fail "the docs' plan: exit codes '${codes[*]}', expected '0 3 137 0'"
[[ "$(record "$d" | cut -d' ' -f1 | tr '\n' ' ')" == "preempt term index-fsync kill " ]] \
  || fail "the docs' plan: the record is '$(record "$d")'"
same_as_ref "$d" "the docs' plan"
fi

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "fault_cli_test: OK"
