#!/usr/bin/env bash
# End to end on the real Fashion-MNIST: a training is SIGKILLed mid-run and
# started again with the same command. It must resume from the last
# checkpoint, finish at the expected global_step, leave checkpoint and event
# files that independent readers accept, and end with bitwise the same
# weights, optimizer slots and data position as a run that was never
# interrupted (same seed, same --threads).
#
#   train_e2e_test.sh FOREMAN TOOLS_TESTING_DIR STEPS
set -u
foreman=$1
tools=$2
steps=$3
py=/usr/bin/python3
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() { grep -Eq -- "$1" <<<"$2"; }
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_e2e_test.XXXXXX") || { echo "cannot create a temporary directory under ${TEST_TMPDIR:-/tmp}" >&2; exit 1; }
victim=
cleanup() { [[ -n $victim ]] && kill -9 "$victim" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

if [[ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  echo "FAIL: Fashion-MNIST is missing: install Debian's dataset-fashion-mnist (tools/scripts/install-deps.sh)"
  exit 1
fi

every=$((steps / 8))
# Two threads: determinism must hold for a multi-threaded Eigen pool too.
cmd=(--hidden 64 --batch-size 100 --threads 2 --max-steps "$steps" --save-checkpoint-steps "$every"
     --save-summaries-steps "$every" --eval-every-steps "$((steps / 2))" --log-step-count-steps "$every")

# 1. The reference: never interrupted.
out=$(timeout 600 "$foreman" train --checkpoint-dir "$tmp/ref" "${cmd[@]}" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "the reference run exited $rc: $out"
has "^trained $steps steps" "$out" || fail "the reference run did not train $steps steps: $out"

# 2. The same command, SIGKILLed once it has saved its second checkpoint.
d=$tmp/killed
"$foreman" train --checkpoint-dir "$d" "${cmd[@]}" >"$tmp/first.out" 2>&1 &
victim=$!
# The state file is the commit point of a save (its files are renamed first).
committed() { sed -n 's/^model_checkpoint_path: "model.ckpt-\([0-9]*\)"$/\1/p' "$d/checkpoint" 2>/dev/null; }
for ((i = 0; i < 6000; i++)); do
  step=$(committed)
  [[ -n $step && $step -ge $((2 * every)) ]] && break
  kill -0 "$victim" 2>/dev/null || break
  sleep 0.02
done
kill -9 "$victim" 2>/dev/null
wait "$victim" 2>/dev/null; rc=$?
victim=
[[ $rc -eq 137 ]] || fail "the run was not killed mid-run (exit $rc; it must still be training): $(cat "$tmp/first.out")"
latest=$(sed -n 's/^model_checkpoint_path: "\(.*\)"$/\1/p' "$d/checkpoint" 2>/dev/null)
killed_at=${latest##*-}
[[ $killed_at =~ ^[0-9]+$ && $killed_at -ge $((2 * every)) && $killed_at -lt $steps ]] \
  || fail "the killed run's latest checkpoint is '$latest'"
echo "killed after model.ckpt-$killed_at"

# 3. Again: resumes from the last checkpoint and finishes.
out=$(timeout 600 "$foreman" train --checkpoint-dir "$d" "${cmd[@]}" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "the resumed run exited $rc: $out"
has "Restoring parameters from $d/model.ckpt-$killed_at" "$out" \
  || fail "the resumed run did not restore model.ckpt-$killed_at: $out"
has "^trained $((steps - killed_at)) steps" "$out" || fail "the resumed run should train $((steps - killed_at)) steps: $out"
has "^checkpoints: $d \(latest: $d/model.ckpt-$steps\)" "$out" || fail "the resumed run did not end at $steps: $out"

# 4. Valid files, and the same weights as the reference.
"$py" -B "$tools/check_train_run.py" "$tmp/ref" --step "$steps" --hidden 64 --batch-size 100 --eval \
  || fail "check_train_run on the reference run"
"$py" -B "$tools/check_train_run.py" "$d" --step "$steps" --hidden 64 --batch-size 100 --eval \
  --checkpoint-steps "$killed_at,$steps" --same-as "$tmp/ref" || fail "check_train_run on the resumed run"
"$foreman" inspect "$d" >/dev/null || fail "foreman inspect cannot read the resumed run's checkpoint"
"$foreman" events "$d" >/dev/null || fail "foreman events cannot read the resumed run's events"

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "train_e2e_test: OK"
