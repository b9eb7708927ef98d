#!/usr/bin/env bash
# Power loss: `foreman chaos --disk sim` / `--preset power`
# (docs/fault-injection.md, "Power loss").
#   1. SEEDS seeds of --preset power hold every invariant on the real code,
#      and power cuts fired and restarts were made (the mode did something);
#   2. a disk that lies about one durability rule is caught within a few
#      seeds, by the check made when a save is reported durable -- a missing
#      fsync of the data file, a directory never synced, a lost write
#      (FOREMAN_LYING_DISK, tests/support/foreman_lying_disk_main.cpp), and
#      a lock that does not hold, by the run directory's lock rule; a state
#      file never made durable, by the durable save's state file check; a
#      restart that restores nothing, by the oracle's check;
#   3. a failing seed's replay line, run in another work directory, gives
#      the same report (times aside);
#   4. a planned fault that did not fire although the fault-free run
#      performs its operation is reported ('!' and a line naming it), and
#      one that fired is not;
#   5. --shrink reduces a failing seed's plan to the one power cut the
#      failure needs (a disk that lies only after a power cut,
#      data-sync-after-crash), and its replay line fails again;
#   6. what the mode refuses: a plan's process fault, --preset cluster,
#      --preset power with --disk real, an unknown --disk.
#
#   power_loss_test.sh FOREMAN FOREMAN_LYING_DISK SEEDS FULL [FIRST_SEED]
# SEEDS: seeds of part 1 from FIRST_SEED (default 0): 100 in the release
# build; under the sanitizers 1 from seed 1 (the first seed with a power cut
# that fires: seed 0's never does); FULL=1 also runs parts 3-5 (release
# only: under the sanitizers a simulated process is ~30x slower).
set -u
foreman=$(realpath "$1")
lying=$(realpath "$2")
seeds=$3
full=${4:-1}
first_seed=${5:-0}
data=/usr/share/datasets/fashion-mnist
py=/usr/bin/python3
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() { grep -Eq -- "$1" <<<"$2"; }
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/power_loss_test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
[[ -f $data/train-images-idx3-ubyte.gz ]] || { echo "FAIL: $data is missing (tools/scripts/install-deps.sh)"; exit 1; }

# -- 1. the real code holds every invariant -------------------------------------
out=$(timeout 500 "$foreman" chaos --preset power --seeds "$seeds" --first-seed "$first_seed" --json "$tmp/power.json" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "chaos --preset power --seeds $seeds --first-seed $first_seed exited $rc: $(tail -40 <<<"$out")"
has "^$seeds seeds, 0 failed" "$out" || fail "no '$seeds seeds, 0 failed' line: $(tail -5 <<<"$out")"
"$py" - "$tmp/power.json" "$seeds" <<'PY' || fail "chaos --preset power: the JSON report is not as expected"
import json, sys
r = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
assert r["ok"] is True and len(r["seeds"]) == n
fired = sum(len(s["faults_fired"]) for s in r["seeds"])
restarts = sum(s["restarts"] for s in r["seeds"])
cut = sum(1 for s in r["seeds"] for p in s["runs"] if p["ended_by"].startswith("power cut"))
checked = sum(s["durable_saves_checked"] for s in r["seeds"])
print("faults fired %d, restarts %d, processes ended by a power cut %d, durable saves checked %d" % (fired, restarts, cut, checked))
# With the smallest seed counts (sanitizer builds) at least one cut; with
# hundreds, many.
assert cut >= 1 and restarts >= 1 and checked >= 10 * n, (cut, restarts, checked)
for s in r["seeds"]:
    assert s["runs"][-1]["ended_by"] == "done", s["runs"][-1]
    assert s["replay"] == "foreman chaos --preset power --seed %d" % s["seed"], s["replay"]
PY

# -- 2. a lying disk is caught ----------------------------------------------------
# Each at the first seed: the lie shows at the first save reported durable
# (seed 0 of --preset power plans one power cut, at an operation its job
# never makes: 0/1 fired).
lies=(data-sync dir-sync lost-write)
[[ $full -eq 1 ]] || lies=(data-sync)  # the sanitizers: one lie, the mechanism
for lie in "${lies[@]}"; do
  out=$(FOREMAN_LYING_DISK=$lie timeout 300 "$lying" chaos --preset power --seeds 1 --work-dir "$tmp/lie-$lie" 2>&1); rc=$?
  [[ $rc -eq 1 ]] || fail "a disk lying ($lie): chaos exited $rc, not 1: $(tail -20 <<<"$out")"
  has "^1 seeds, 1 failed" "$out" || fail "a disk lying ($lie): not caught: $(tail -20 <<<"$out")"
  has "checkpoints_verify: run 0: the save of step [0-9]+ was reported durable" "$out" ||
    fail "a disk lying ($lie): the durable-save check did not name it: $(grep -m3 checkpoints_verify <<<"$out")"
  # The failed seed's disk is copied out for a person to read.
  ls "$tmp/lie-$lie"/seed-0/run/checkpoint >/dev/null 2>&1 || fail "a disk lying ($lie): seed 0's run directory was not copied out"
done

# A state file that never became durable (its sync, or its directory's sync,
# lost): the checkpoint itself is whole, so only the durable save's state
# file check can name it (the oracle alone falls back to the newest bundle).
if [[ $full -eq 1 ]]; then
for lie in state-sync state-dir-sync; do
  out=$(FOREMAN_LYING_DISK=$lie timeout 300 "$lying" chaos --preset power --seeds 1 --work-dir "$tmp/lie-$lie" 2>&1); rc=$?
  [[ $rc -eq 1 ]] || fail "a disk lying ($lie): chaos exited $rc, not 1: $(tail -20 <<<"$out")"
  has "checkpoints_verify: run 0: the save of step 0 was reported durable, but the disk a power cut then leaves has (no state file|a state file that does not parse)" "$out" ||
    fail "a disk lying ($lie): the durable save's state file check did not name it: $(grep -m3 checkpoints_verify <<<"$out")"
done
fi

# An event file with a cut record in its middle (the third append of each
# written as half a record, then the whole record: the retry that once broke
# TensorBoard's reading): the check after every flush names the file.
if [[ $full -eq 1 ]]; then
out=$(FOREMAN_LYING_DISK=event-retry timeout 120 "$lying" chaos --preset power --seeds 1 --work-dir "$tmp/lie-events" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "an event file's retried record: chaos exited $rc, not 1: $(tail -20 <<<"$out")"
has "scalars_once: run 0: event file (eval/)?events\.out\.tfevents\.[^ ]+ after a flush: record [0-9]+ at byte [0-9]+" "$out" ||
  fail "an event file's retried record: the check after every flush did not name it: $(grep -m3 scalars_once <<<"$out")"
fi

if [[ $full -eq 1 ]]; then
out=$(FOREMAN_LYING_DISK=lost-lock timeout 300 "$lying" chaos --preset power --seeds 1 --work-dir "$tmp/lie-lock" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "a lock that does not hold: chaos exited $rc, not 1: $(tail -20 <<<"$out")"
has "checkpoints_verify: run 0: create model.ckpt-0.* while the directory's lock was not held" "$out" ||
  fail "a lock that does not hold: the lock rule did not name it: $(grep -m3 checkpoints_verify <<<"$out")"

# A restart that restores nothing although a whole checkpoint is there (a
# disk that, once it lost power, shows the job no checkpoint): the oracle's
# step is compared with what every process that trained restored, -1 for
# nothing (seed 1: a power cut after the save of step 40).
out=$(FOREMAN_LYING_DISK=forget-after-crash timeout 120 "$lying" chaos --preset power --seed 1 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "a restart that restores nothing: chaos exited $rc, not 1: $(tail -20 <<<"$out")"
has "global_step: run 1 restored nothing, but the checkpoint to restore \(the oracle's\) is step 40" "$out" ||
  fail "a restart that restores nothing: the oracle's check did not name it: $(grep -m3 global_step <<<"$out")"

# -- 3. the replay line reproduces a failing seed elsewhere -----------------------
FOREMAN_LYING_DISK=data-sync timeout 120 "$lying" chaos --preset power --seed 1 --work-dir "$tmp/r1" --json "$tmp/r1.json" >"$tmp/r1.out" 2>&1
(mkdir -p "$tmp/elsewhere" && cd "$tmp/elsewhere" &&
  FOREMAN_LYING_DISK=data-sync timeout 120 "$lying" chaos --preset power --seed 1 --work-dir "$tmp/elsewhere/r2" --json "$tmp/r2.json" >"$tmp/r2.out" 2>&1)
"$py" - "$tmp/r1.json" "$tmp/r2.json" <<'PY' || fail "the replay of a failing seed in another work directory gave another report"
import json, sys
def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if not k.endswith("_ms")}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o
a, b = (strip(json.load(open(p))) for p in sys.argv[1:])
assert a["failed"] == 1, a["failed"]
assert a == b, [(k, a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)]
PY

# -- 4. unfired faults are findings ------------------------------------------------
# An INTERNAL step fault at 150 ends the first process (restored at 140): no
# process of the faulted run writes the state file 11 times, the fault-free
# run does.
cat > "$tmp/unfired.json" <<'JSON'
{"seed": 7, "faults": [
  {"id": "internal", "type": "step", "status": "INTERNAL", "at_step": 150},
  {"id": "late-state", "type": "env", "path": "*/checkpoint.tmp*", "op": "rename", "error": "EIO", "nth": 11}]}
JSON
out=$(timeout 120 "$foreman" chaos --disk sim --plan "$tmp/unfired.json" --seed 7 --json "$tmp/unfired-report.json" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "unfired plan: chaos exited $rc: $out"
has '^ +7 +1/2! ' "$out" || fail "unfired plan: the table does not mark the seed's faults with '!': $out"
has "seed 7: late-state: the fault-free run performs the operation it waits for \(rename #11 of checkpoint\)" "$out" ||
  fail "unfired plan: the finding is not named: $out"
has "seed 7: internal" "$out" && fail "unfired plan: a fault that fired is reported as unfired: $out"
"$py" -c 'import json,sys; s=json.load(open(sys.argv[1]))["seeds"][0]; sys.exit(0 if len(s["unfired_faults"]) == 1 and s["unfired_faults"][0].startswith("late-state: ") else 1)' \
  "$tmp/unfired-report.json" || fail "unfired plan: the JSON report's unfired_faults is not [late-state]"

# -- 5. shrinking -------------------------------------------------------------------
# Seed 2 of --preset power: two power cuts and a torn write; only the first
# cut matters to a disk that lies once it has lost power.
out=$(FOREMAN_LYING_DISK=data-sync-after-crash timeout 300 "$lying" chaos --preset power --shrink 2 --work-dir "$tmp/shrink" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "--shrink 2: exit $rc, not 1: $(tail -20 <<<"$out")"
has "^seed 2's plan shrunk from 3 to 1 faults in [0-9]+ runs; it still fails checkpoints_verify" "$out" ||
  fail "--shrink 2: not shrunk to one fault: $(tail -25 <<<"$out")"
"$py" -c 'import json,sys; p=json.load(open(sys.argv[1])); f=p["faults"]; sys.exit(0 if len(f) == 1 and f[0]["kind"] == "crash" else 1)' \
  "$tmp/shrink/shrunk-seed-2.json" || fail "--shrink 2: the shrunk plan is not one crash fault: $(cat "$tmp/shrink/shrunk-seed-2.json")"
replay=$(grep -m1 '^replay: ' <<<"$out" | sed 's/^replay: foreman //')
[[ -n $replay ]] || fail "--shrink 2: no replay line: $out"
# shellcheck disable=SC2086
out=$(FOREMAN_LYING_DISK=data-sync-after-crash timeout 120 "$lying" $replay 2>&1); rc=$?
[[ $rc -eq 1 ]] && has "^1 seeds, 1 failed" "$out" || fail "the shrunk plan's replay does not fail: exit $rc: $(tail -5 <<<"$out")"
out=$(timeout 120 "$foreman" chaos --preset power --shrink 2 2>&1); rc=$?
[[ $rc -eq 0 ]] && has "seed 2 holds every invariant: nothing to shrink" "$out" ||
  fail "--shrink of a seed that holds: exit $rc: $(tail -5 <<<"$out")"


# -- 6. refused ----------------------------------------------------------------------
cat > "$tmp/kill.json" <<'JSON'
{"seed": 1, "faults": [{"id": "k", "type": "process", "signal": "SIGKILL", "at_step": 5}]}
JSON
out=$(timeout 60 "$foreman" chaos --disk sim --plan "$tmp/kill.json" --seed 1 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "a process fault under --disk sim: exit $rc, not 2: $out"
has 'fault "k": a process fault signals the process' "$out" || fail "a process fault under --disk sim: message: $out"
fi  # full
for bad in "--preset cluster --disk sim" "--preset power --disk real" "--disk floppy" "--shrink 1 --seeds 3"; do
  # shellcheck disable=SC2086
  out=$(timeout 30 "$foreman" chaos $bad --seed 1 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "chaos $bad: exit $rc, not 2: $out"
done
# Each refused with its own message (exit 2, before any run).
while IFS='|' read -r bad msg; do
  # shellcheck disable=SC2086
  out=$(timeout 30 "$foreman" chaos $bad 2>&1); rc=$?
  [[ $rc -eq 2 ]] && has "$msg" "$out" || fail "chaos $bad: exit $rc, not 2 with '$msg': $out"
done <<'BAD'
--preset power --shrink 1 --json x.json|--shrink writes the shrunk plan .*not with --json
--preset power --shrink -1|--shrink must be >= 0, got -1
--preset power --shrink 1 --seeds 3|--shrink SEED shrinks one seed's plan: not with --seed, --seeds or --first-seed
--disk floppy --preset power|--disk
BAD

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "power_loss: ok"
