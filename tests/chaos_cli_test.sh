#!/usr/bin/env bash
# `foreman chaos` (docs/fault-injection.md, "foreman chaos"): bad flags (exit
# 2); `--preset all --seeds N` holds every invariant (exit 0) with faults
# fired and restarts made; a replay of one seed gives the same report apart
# from the *_ms timings; disturbed runs where an invariant must fail (exit 1,
# the replay command printed): a corrupted checkpoint (FOREMAN_TESTING, a
# test build of the program that flips a byte of it), a plan that ends training early
# without declaring it, a job that does not end within --timeout-secs (and
# leaves no process behind).
#
#   chaos_cli_test.sh FOREMAN SEEDS FULL FOREMAN_TESTING
# SEEDS: how many seeds of --preset all (30 in the release build, 2 under the
# sanitizers); FULL=1 also runs the replay and the plan tests (release only:
# under the sanitizers each foreman train is ~30x slower).
set -u
foreman=$1
seeds=$2
full=$3
foreman_testing=$4  # tests/support/foreman_testing_main.cpp
data=/usr/share/datasets/fashion-mnist
py=/usr/bin/python3
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() { grep -Eq -- "$1" <<<"$2"; }
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/chaos_cli_test.XXXXXX") || { echo "cannot create a temporary directory under ${TEST_TMPDIR:-/tmp}" >&2; exit 1; }
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp  # foreman chaos's temporary work directories go here too

if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  echo "FAIL: $data is missing: install Debian's dataset-fashion-mnist (tools/scripts/install-deps.sh)"
  exit 1
fi

# Drops every *_ms field; then the two reports (or one seed of each) must be equal.
same_report() {
  "$py" - "$@" <<'EOF'
import json, sys
def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if not k.endswith("_ms")}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o
a = strip(json.load(open(sys.argv[1])))
b = strip(json.load(open(sys.argv[2])))
if len(sys.argv) > 3:  # compare one seed of each
    a = [s for s in a["seeds"] if s["seed"] == int(sys.argv[3])]
    b = [s for s in b["seeds"] if s["seed"] == int(sys.argv[3])]
if a != b or not a:
    print(json.dumps(a, sort_keys=True)[:2000]); print(json.dumps(b, sort_keys=True)[:2000]); sys.exit(1)
EOF
}

# -- 1. bad flags: exit 2, naming what is wrong ----------------------------------------
check_usage() {
  local pattern=$1; shift
  local out rc
  out=$(timeout 120 "$foreman" chaos "$@" 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "chaos $* exited $rc, expected 2: $out"
  has "$pattern" "$out" || fail "chaos $*: message should match '$pattern': $out"
}
check_usage '--seeds must be in \[1, 1000000\], got 0' --seeds 0
check_usage "unknown preset 'nope'" --preset nope
check_usage 'give --preset or --plan, not both' --preset all --plan "$tmp/p.json"
check_usage 'give --seed K .* not both' --seed 1 --seeds 2
check_usage 'may not set --checkpoint-dir' --seed 1 -- --checkpoint-dir "$tmp/x"
check_usage "--plan $tmp/missing.json: no such file" --plan "$tmp/missing.json"
printf '{"faults": [{"id": "a", "type": "step", "status": "ABORTED", "at_step": 3, "reapeat": true}]}\n' >"$tmp/typo.json"
check_usage 'typo.json: faults\[0\] \("a"\): unknown field "reapeat"' --plan "$tmp/typo.json"
check_usage '--timeout-secs must be in' --timeout-secs 0
printf '{"changes_training": "yes", "faults": []}\n' >"$tmp/yes.json"
check_usage 'yes.json: "changes_training" must be true or false, got "yes"' --plan "$tmp/yes.json"
# An unwritable --json is refused before any run (no work directory made).
check_usage "--json $tmp/no-such-dir/r.json: No such file or directory" --seed 0 --json "$tmp/no-such-dir/r.json" \
  --work-dir "$tmp/json-refused"
[[ ! -e $tmp/json-refused ]] || fail "a refused --json still made the work directory"
check_usage "--json $tmp: Is a directory" --seed 0 --json "$tmp"
# A --json that passes the check but is never written leaves no file behind.
check_usage 'exited 2: foreman train: bad flags: --batch-size must be' --seed 0 --json "$tmp/never.json" -- --batch-size 0
[[ ! -e $tmp/never.json ]] || fail "the up-front --json check left $tmp/never.json behind"
# Train flags foreman train refuses: the fault-free run says so (exit 2).
check_usage 'the fault-free run .* exited 2: foreman train: bad flags: --batch-size must be' --seed 0 -- --batch-size 0
# ... and CLI11's refusals: the error line, not only its "Run 'foreman --help'" hint.
check_usage "exited 2: foreman: error: --max-steps: 'abc' is not a whole number" --seed 0 -- --max-steps abc
# A --timeout-secs below the job's run time: the message names the value given.
out=$(timeout 120 "$foreman" chaos --seed 0 --timeout-secs 0.01 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "--timeout-secs 0.01 exited $rc, expected 1: $out"
has 'did not end within --timeout-secs 0.01 \(allowed: \(0, 86400\]' "$out" || fail "--timeout-secs 0.01: value not named: $out"
mkdir -p "$tmp/notmine" && touch "$tmp/notmine/precious"
check_usage 'is not empty and was not made by foreman chaos' --seed 0 --work-dir "$tmp/notmine"
[[ -e $tmp/notmine/precious ]] || fail "a refused --work-dir lost its file"

# -- 2. --preset all: every invariant holds, faults fire, the job restarts ---------------
out=$(timeout 600 "$foreman" chaos --preset all --seeds "$seeds" --json "$tmp/all.json" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "chaos --preset all --seeds $seeds exited $rc: $out"
has "^$seeds seeds, 0 failed" "$out" || fail "chaos --preset all: no summary line: $out"
has 'seed +faults +firings +restarts +steps_lost +checkpoints +global_step +final_weights +scalars_once +bounded +finished' "$out" ||
  fail "chaos --preset all: no table header: $out"
grep -q "$tmp" "$tmp/all.json" && fail "the JSON report holds an absolute path: $(grep -m1 "$tmp" "$tmp/all.json")"
"$py" - "$tmp/all.json" "$seeds" <<'EOF' || fail "chaos --preset all: the JSON report is not as expected"
import json, sys
r = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
names = {"checkpoints_verify", "global_step", "final_weights", "scalars_once", "bounded", "finished"}
assert r["ok"] is True and r["failed"] == 0, r["failed"]
assert [s["seed"] for s in r["seeds"]] == list(range(n)), [s["seed"] for s in r["seeds"]]
for s in r["seeds"]:
    assert set(s["invariants"]) == names, s["invariants"].keys()
    assert all(i["ok"] and i["checked"] for i in s["invariants"].values()), s
    assert s["runs"][-1]["ended_by"] == "done" and s["runs"][-1]["last_step"] == r["baseline"]["global_step"], s
    assert s["replay"] == "foreman chaos --preset all --seed %d" % s["seed"], s["replay"]
# A preset's plan is a pure function of (preset, seed), the same on every
# machine and library version: seed 1 of `all` is pinned here.
if n > 1:
    assert s and r["seeds"][1]["plan"] == {"seed": 1, "faults": [
        {"id": "signal-1", "type": "process", "signal": "SIGKILL", "at_step": 68},
        {"id": "actor-2", "type": "actor", "service": "step_counter", "kind": "kill", "at_step": 97},
        {"id": "step-3", "type": "step", "status": "UNAVAILABLE", "at_step": 29}]}, \
        r["seeds"][1]["plan"]
# The faults really fired and the job really was restarted.
assert sum(len(s["faults_fired"]) for s in r["seeds"]) >= n, "too few faults fired"
assert sum(s["restarts"] for s in r["seeds"]) >= 1, "no restart"
# Recovery metrics (issue 14 point 4): the in-process recoveries the event
# files show (a later process restart may purge some), each with its times.
for s in r["seeds"]:
    m = s["recovery_metrics"]
    assert len(m) <= s["in_process_recoveries"], (s["seed"], m, s["in_process_recoveries"])
    assert sum(x["steps_lost"] for x in m) <= s["in_process_steps_lost"], (s["seed"], m)
    for x in m:
        assert x["recoveries"] >= 1 and x["steps_lost"] >= 0 and x["detect_ms"] >= 0 and x["restore_ms"] >= 0, x
if n >= 10:
    assert any(s["recovery_metrics"] for s in r["seeds"]), "no recovery/... summaries in any seed"
EOF
[[ -z $(ls -A "$tmp" | grep '^foreman-chaos-') ]] || fail "a passing chaos run left its temporary work directory"

# -- 3. a disturbed run: a corrupted checkpoint fails checkpoints_verify ----------------
printf '{"faults": []}\n' >"$tmp/empty.json"
# 40 steps (a fifth of the default): enough for two checkpoints, and cheap
# under the sanitizers.
corrupt_flags=(--max-steps 40 --hidden 32 --batch-size 32 --save-checkpoint-steps 20 --threads 1)
out=$(timeout 120 "$foreman_testing" chaos --plan "$tmp/empty.json" --seed 4 \
      --json "$tmp/corrupt.json" -- "${corrupt_flags[@]}" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "a corrupted checkpoint: exit $rc, expected 1: $out"
has '^ +4 +0/0 +0 +0 +0 +FAIL ' "$out" || fail "a corrupted checkpoint: the table does not show checkpoints FAIL: $out"
has "checkpoints_verify: after run 0: model.ckpt-40: .*model.ckpt-40.data-00000-of-00001: variable '.*': crc32c mismatch" "$out" ||
  fail "a corrupted checkpoint: the failure is not named: $out"
has "^  replay: foreman chaos --plan $tmp/empty.json --seed 4 -- ${corrupt_flags[*]}\$" "$out" || fail "a corrupted checkpoint: no replay command: $out"
has '^work directory: ' "$out" || fail "a failing run does not say where its work directory is: $out"
"$py" -c 'import json,sys; r=json.load(open(sys.argv[1])); i=r["seeds"][0]["invariants"]; sys.exit(0 if not r["ok"] and not i["checkpoints_verify"]["ok"] and i["bounded"]["ok"] else 1)' \
  "$tmp/corrupt.json" || fail "a corrupted checkpoint: the JSON report does not name checkpoints_verify"

# -- 4. a job that hangs: killed at --timeout-secs, bounded fails, nothing left ---------
out=$(timeout 120 "$foreman" chaos --plan "$tmp/empty.json" --seed 0 --timeout-secs 0.3 --work-dir "$tmp/hang" \
      -- --max-steps 1000000 --hidden 32 --threads 1 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "a hanging job: exit $rc, expected 1: $out"
has 'the fault-free run .* did not end within --timeout-secs' "$out" || fail "a hanging job: not named: $out"
pgrep -f -- "$tmp/hang" >/dev/null && fail "a hanging job left processes: $(pgrep -af -- "$tmp/hang")"

if [[ $full == 1 ]]; then
  # -- 4b. a seed that hangs (a 30 s fsync): killed at --timeout-secs, bounded fails -----
  printf '{"faults": [{"id": "slow-disk", "type": "env", "op": "sync", "latency_ms": 30000, "nth": 1}]}\n' >"$tmp/slow.json"
  out=$(timeout 120 "$foreman" chaos --plan "$tmp/slow.json" --seed 0 --timeout-secs 5 --work-dir "$tmp/slow" 2>&1); rc=$?
  [[ $rc -eq 1 ]] || fail "a hanging seed: exit $rc, expected 1: $out"
  has 'bounded: run 0 did not end within --timeout-secs 5 \(its process group was killed\)' "$out" ||
    fail "a hanging seed: bounded does not fail: $out"
  has 'finished: run 0 ended by timeout \(killed\): not restarted' "$out" || fail "a hanging seed: finished: $out"
  pgrep -f -- "$tmp/slow" >/dev/null && fail "a hanging seed left processes: $(pgrep -af -- "$tmp/slow")"

  # -- 4c. SIGTERM to chaos mid-seed: the job is killed, exit 143, the work directory named -
  mkdir -p "$tmp/sig"
  TMPDIR="$tmp/sig" timeout 120 "$foreman" chaos --plan "$tmp/slow.json" --seed 0 >"$tmp/sig.out" 2>&1 &
  chaos_pid=$!
  for _ in $(seq 300); do  # at most 30 s for seed 0's job to start (and hang in its fsync)
    pgrep -f -- "$tmp/sig/foreman-chaos-.*/seed-0/" >/dev/null && break
    sleep 0.1
  done
  kill -TERM "$chaos_pid"
  wait "$chaos_pid"; rc=$?
  out=$(cat "$tmp/sig.out")
  [[ $rc -eq 143 ]] || fail "SIGTERM to chaos: exit $rc, expected 143 (128 + SIGTERM): $out"
  has "^foreman chaos: work directory kept: $tmp/sig/foreman-chaos-" "$out" || fail "SIGTERM to chaos: the work directory is not named: $out"
  pgrep -f -- "$tmp/sig/" >/dev/null && fail "SIGTERM to chaos left processes: $(pgrep -af -- "$tmp/sig/")"

  # -- 5. replay: the same seed twice gives the same report (apart from *_ms) -------------
  k=$("$py" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(max(r["seeds"], key=lambda s: (s["restarts"], len(s["faults_fired"])))["seed"])' "$tmp/all.json")
  for i in 1 2; do
    out=$(timeout 120 "$foreman" chaos --preset all --seed "$k" --json "$tmp/replay$i.json" 2>&1); rc=$?
    [[ $rc -eq 0 ]] || fail "replay $i of seed $k exited $rc: $out"
  done
  same_report "$tmp/replay1.json" "$tmp/replay2.json" || fail "two replays of seed $k differ"
  same_report "$tmp/all.json" "$tmp/replay1.json" "$k" || fail "the replay of seed $k differs from its run among --seeds"
  # A seed that kills a service actor (the step counter at step 70): the
  # kill is asynchronous, and the run once ended at step 71 or 75.
  for i in 1 2 3; do
    out=$(timeout 120 "$foreman" chaos --preset actors --seed 0 --json "$tmp/actors$i.json" 2>&1); rc=$?
    [[ $rc -eq 0 ]] || fail "replay $i of --preset actors --seed 0 exited $rc: $out"
  done
  same_report "$tmp/actors1.json" "$tmp/actors2.json" && same_report "$tmp/actors1.json" "$tmp/actors3.json" \
    || fail "three replays of --preset actors --seed 0 differ"

  # -- 6. a plan that changes training: undeclared it fails, declared it passes ----------
  printf '{"faults": [{"id": "end-of-data", "type": "step", "status": "OUT_OF_RANGE", "at_step": 50}]}\n' >"$tmp/early.json"
  out=$(timeout 120 "$foreman" chaos --plan "$tmp/early.json" --seed 0 2>&1); rc=$?
  [[ $rc -eq 1 ]] || fail "an undeclared change of training: exit $rc, expected 1: $out"
  has 'final_weights: model.ckpt-50 against the fault-free model.ckpt-200: differ: ' "$out" ||
    fail "an undeclared change of training: final_weights does not fail: $out"
  has 'finished: ended at step 50, the fault-free run at step 200' "$out" || fail "an undeclared early end: not named: $out"
  has "replay: foreman chaos --plan $tmp/early.json --seed 0" "$out" || fail "an undeclared change of training: no replay: $out"
  printf '{"changes_training": true, "faults": [{"id": "end-of-data", "type": "step", "status": "OUT_OF_RANGE", "at_step": 50}]}\n' \
    >"$tmp/declared.json"
  out=$(timeout 120 "$foreman" chaos --plan "$tmp/declared.json" --seed 0 2>&1); rc=$?
  [[ $rc -eq 0 ]] || fail "a declared change of training: exit $rc, expected 0: $out"
  has '^ +0 +1/1 +1 +0 +0 +ok +ok +- +ok +ok +ok$' "$out" || fail "a declared change of training: final_weights not '-': $out"

  # A plan foreman train refuses (a crash fault over the real disk): the first
  # seed's refusal is chaos's exit 2, with train's message; no further seed runs.
  printf '{"faults": [{"id": "power-cut", "type": "env", "kind": "crash", "op": "sync", "nth": 1}]}\n' >"$tmp/crash.json"
  out=$(timeout 120 "$foreman" chaos --plan "$tmp/crash.json" --seeds 3 --work-dir "$tmp/refused" \
        -- --max-steps 5 --hidden 8 --threads 1 --eval-every-steps 0 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "a plan train refuses: exit $rc, expected 2: $out"
  has "seed 0: foreman train refused .*: foreman train: bad fault plan: $tmp/crash.json: fault \"power-cut\": kind crash" \
    "$out" || fail "a plan train refuses: train's message not shown: $out"
  [[ ! -e $tmp/refused/seed-1 ]] || fail "a plan train refuses: seed 1 still ran"

  # A repeat fault that fires at every checkpoint: faults 1/1, firings 4; the
  # report holds no absolute path though --plan and --data-dir are absolute.
  printf '{"faults": [{"id": "slow-index", "type": "env", "path": "*.index*", "op": "sync", "latency_ms": 0, "probability": 1, "repeat": true}]}\n' \
    >"$tmp/repeat.json"
  out=$(timeout 120 "$foreman" chaos --plan "$tmp/repeat.json" --seed 0 --json "$tmp/repeat-report.json" \
        -- --max-steps 60 --hidden 8 --save-checkpoint-steps 20 --threads 1 --eval-every-steps 0 --data-dir "$data" 2>&1); rc=$?
  [[ $rc -eq 0 ]] || fail "a repeat fault: exit $rc, expected 0: $out"
  has '^ +0 +1/1 +4 +0 +0 +ok +ok +ok +ok +ok +ok$' "$out" || fail "a repeat fault: not faults 1/1, firings 4: $out"
  "$py" - "$tmp/repeat-report.json" <<'EOF' || fail "the report of a run with absolute --plan and --data-dir holds an absolute path"
import json, re, sys
def strings(o):
    if isinstance(o, dict):
        for k, v in o.items():
            yield k; yield from strings(v)
    elif isinstance(o, list):
        for v in o: yield from strings(v)
    elif isinstance(o, str):
        yield o
r = json.load(open(sys.argv[1]))
bad = [s for s in strings(r) if re.search(r"(^|[\s='])/", s)]
assert not bad, bad
assert "--data-dir" in r["train_flags"] and r["seeds"][0]["replay"].startswith("foreman chaos --plan "), r
EOF

  # -- 7. under a restart policy (issue 14): a killed service actor is restarted in
  #    process (the job does not exit for it), every invariant holds, and the
  #    report lists the restarts and the summary steps a restarted writer lost.
  small=(--max-steps 200 --hidden 32 --batch-size 32 --save-checkpoint-steps 20 --save-summaries-steps 10
         --threads 1 --eval-every-steps 0)
  policy=(--restart-policy one_for_one,permanent,max_restarts=5,period_secs=60)
  # Seed 14 kills the summary writer and then the input pipeline's producer,
  # seed 15 the producer (the final weights must still be the baseline's).
  out=$(timeout 120 "$foreman" chaos --preset actors --first-seed 14 --seeds 2 --json "$tmp/policy.json" -- "${small[@]}" "${policy[@]}" 2>&1); rc=$?
  [[ $rc -eq 0 ]] || fail "--preset actors under a permanent restart policy: exit $rc, expected 0: $out"
  n=$("$py" -c 'import json,sys; print(sum(s["service_restarts"] for s in json.load(open(sys.argv[1]))["seeds"]))' "$tmp/policy.json")
  [[ $n -gt 0 ]] || fail "--preset actors under a permanent restart policy: no service restart in the report: $out"
  has '^  seed 14: 2 service restart\(s\); summary steps lost: \[\]$' "$out" \
    || fail "--preset actors under a restart policy: seed 14's restarts (writer, input pipeline) not listed: $out"
  has '^    summary_writer\(seed-14/run\) restarted; summary steps lost: \[\]; after: INTERNAL: injected actor fault actor-1$' "$out" \
    || fail "--preset actors under a restart policy: the writer's restart is not described: $out"
  has '^    input_pipeline\(1\) restarted; after: INTERNAL: injected actor fault actor-2$' "$out" \
    || fail "--preset actors under a restart policy: the input pipeline's restart is not described: $out"
  # Two failed appends in a row (the write, then the writer's retry as it
  # closes the file): what it held is lost, and listed.
  printf '%s\n' '{"faults": [' \
    '{"id": "events-eio", "type": "env", "path": "*events.out.tfevents*", "op": "append", "error": "EIO", "nth": 20},' \
    '{"id": "events-eio-again", "type": "env", "path": "*events.out.tfevents*", "op": "append", "error": "EIO", "nth": 21}]}' \
    >"$tmp/events-eio.json"
  out=$(timeout 120 "$foreman" chaos --plan "$tmp/events-eio.json" --seed 0 -- "${small[@]}" "${policy[@]}" 2>&1); rc=$?
  [[ $rc -eq 0 ]] || fail "a summary writer restarted after EIO: exit $rc, expected 0: $out"
  has '^  seed 0: 1 service restart\(s\); summary steps lost: \[[0-9]+(, [0-9]+)*\]$' "$out" \
    || fail "a summary writer restarted after EIO: its lost steps are not listed: $out"
  has '^    summary_writer\(seed-0/run\) restarted; summary steps lost: \[[0-9]' "$out" \
    || fail "a summary writer restarted after EIO: the restart is not described: $out"
  # Replays under a policy compare equal too: seed 1 of --preset disk loses two
  # saves, and the reasons name temporary files that differ from run to run
  # (".tempstate<n>", "checkpoint.tmp<pid>-<n>"): the JSON keeps their codes.
  for i in 1 2; do
    out=$(timeout 120 "$foreman" chaos --preset disk --seed 1 --json "$tmp/disk-policy$i.json" -- "${small[@]}" "${policy[@]}" 2>&1); rc=$?
    [[ $rc -eq 0 ]] || fail "replay $i of --preset disk --seed 1 under a policy exited $rc: $out"
  done
  grep -q 'checkpoint saves lost: \[160\]; after: RESOURCE_EXHAUSTED"' "$tmp/disk-policy1.json" \
    || fail "--preset disk --seed 1 under a policy: the lost save is not in the JSON: $(cat "$tmp/disk-policy1.json")"
  same_report "$tmp/disk-policy1.json" "$tmp/disk-policy2.json" || fail "two replays of --preset disk --seed 1 under a policy differ"

  # The soak script (tools/scripts/chaos_soak.sh, docs/reliability.md) at its
  # smallest: two presets, seeds split over two chaos processes, one table.
  soak=$(dirname "$0")/../tools/scripts/chaos_soak.sh
  build_dir=$(cd "$(dirname "$foreman")/.." && pwd)
  out=$(timeout 300 "$soak" --seeds 2 --first-seed 5 --presets steps,signals --jobs 2 --build-dir "$build_dir" \
        --out "$tmp/soak" 2>&1); rc=$?
  [[ $rc -eq 0 ]] || fail "chaos_soak.sh exited $rc: $out"
  has '^\| steps \| 2 \| 0 \| [0-9]+ \| [0-9]+ \| ' "$out" || fail "chaos_soak.sh: no steps row of 2 seeds: $out"
  has '^\| signals \| 2 \| 0 \| [0-9]+ \| [0-9]+ \| ' "$out" || fail "chaos_soak.sh: no signals row of 2 seeds: $out"
  [[ -f $tmp/soak/table.md && -f $tmp/soak/steps-5.json && -f $tmp/soak/steps-6.json ]] \
    || fail "chaos_soak.sh: reports not kept: $(ls "$tmp/soak")"
  out=$(timeout 60 "$soak" --seeds 1 --presets no-such-preset --build-dir "$build_dir" --out "$tmp/soak-bad" 2>&1); rc=$?
  [[ $rc -eq 1 ]] || fail "chaos_soak.sh with a bad preset exited $rc, expected 1: $out"
  has 'no-such-preset-0.json .*unknown preset .no-such-preset.' "$out" || fail "chaos_soak.sh with a bad preset: not named: $out"
fi

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "chaos_cli_test: OK"
