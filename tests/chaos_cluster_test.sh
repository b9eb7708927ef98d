#!/usr/bin/env bash
# `foreman chaos --preset cluster` (docs/fault-injection.md, "--preset
# cluster"): bad train flags exit 2 naming the flag; seed 165 of a
# 2000-step job (its plan: SIGKILL the ps at the chief's step 75, restart it
# 1.171 s later; SIGKILL worker 1 at step 234, restart it 0.255 s later)
# holds every invariant that applies (exit 0): both events fired, two
# restarts, the killed runs exited 137, the last run of every task exited 0,
# the chief's final checkpoint is at step >= 2000, the per-task logs and the
# plan are in the seed's directory, final_weights and scalars_once are
# reported as not checked, and no task process is left. A run under a
# --timeout-secs too short for its job fails `bounded` and `finished`
# (exit 1, the replay printed) and leaves no process. Seed 322 of a
# 1000-step job cuts the ps off, then kills it (part 4; where network
# namespaces cannot be made, it checks that the report says why). About 13 s.
#
#   chaos_cluster_test.sh FOREMAN
set -u
foreman=$1
NAME=chaos_cluster_test
# shellcheck source=support/cluster_test_lib.sh
source "$(dirname "$0")/support/cluster_test_lib.sh"

job=(--max-steps 2000 --hidden 16 --batch-size 50 --threads 1 --eval-every-steps 0)

# 1. Bad flags: exit 2, naming the flag, before any run.
out=$("$foreman" chaos --preset cluster --seed 0 --work-dir "$tmp/bad" -- "${job[@]}" --ps-hosts 127.0.0.1:1 2>&1)
rc=$?
[[ $rc -eq 2 ]] && has "may not set --ps-hosts" "$out" || fail "--ps-hosts after --: exit $rc: $out"
[[ ! -e $tmp/bad ]] || fail "a refused run made its work directory"
out=$("$foreman" chaos --preset cluster --seed 0 -- --hidden 16 2>&1)
rc=$?
[[ $rc -eq 2 ]] && has "needs --max-steps" "$out" || fail "no --max-steps after --: exit $rc: $out"
out=$("$foreman" chaos --preset clusters 2>&1)
rc=$?
[[ $rc -eq 2 ]] && has "unknown preset 'clusters'.*cluster" "$out" || fail "--preset clusters: exit $rc: $out"

# 2. Seed 165: a ps kill, then a worker kill.
work=$tmp/work
"$foreman" chaos --preset cluster --seed 165 --work-dir "$work" --json "$tmp/report.json" -- "${job[@]}" \
  >"$tmp/chaos.out" 2>&1 &
chaos_pid=$!
pids+=("$chaos_pid")
wait_bounded "$chaos_pid" 120
out=$(cat "$tmp/chaos.out")
[[ $rc -eq 0 ]] || fail "seed 165 exited $rc: $out"
has "^ +165 +2/2 +2 " "$out" || fail "the text report's row is not 'seed 165, faults 2/2, restarts 2': $out"
"$py" - "$tmp/report.json" "$work/seed-165" <<'EOF' || fail "the JSON report or the seed's files: $out"
import json, os, sys
r = json.load(open(sys.argv[1]))
d = sys.argv[2]
bad = []
def check(cond, what):
    if not cond:
        bad.append(what)
check(r["preset"] == "cluster" and r["ok"] and r["failed"] == 0, "the report is not an ok cluster run")
s = r["seeds"][0]
plan = json.load(open(os.path.join(d, "plan.json")))
check(plan == s["plan"], "plan.json differs from the report's plan")
ev = [(e["kill"], e["at_chief_step"], e["restart_after_ms"]) for e in plan["events"]]
check(ev == [("ps", 75, 1171), ("worker 1", 234, 255)], f"seed 165's plan changed: {ev}")
check(s["faults_fired"] == ["e0", "e1"], f"fired {s['faults_fired']}")
check(s["restarts"] == 2, f"restarts {s['restarts']}")
for name in ("checkpoints_verify", "global_step", "bounded", "finished"):
    i = s["invariants"][name]
    check(i["ok"] and i["checked"], f"{name}: {i}")
for name in ("final_weights", "scalars_once"):
    i = s["invariants"][name]
    check(i["ok"] and not i["checked"] and i["details"], f"{name} should be 'not checked': {i}")
runs = {(x["task"], x["n"]): x for x in s["runs"]}
check(set(runs) == {("ps", 0), ("ps", 1), ("worker 1", 0), ("worker 1", 1), ("chief", 0)}, f"runs {sorted(runs)}")
for k, code in ((("ps", 0), 137), (("worker 1", 0), 137), (("ps", 1), 0), (("worker 1", 1), 0), (("chief", 0), 0)):
    check(k in runs and runs[k]["exit_code"] == code, f"{k} exit {runs.get(k, {}).get('exit_code')}, want {code}")
check(runs.get(("chief", 0), {}).get("last_step", -1) >= 2000, "the chief did not reach step 2000")
for f in ("ps-0.log", "ps-1.log", "worker1-0.log", "worker1-1.log", "chief-0.log"):
    check(os.path.isfile(os.path.join(d, f)), f"no {f}")
ckpts = sorted(int(f[len("model.ckpt-"):-len(".index")]) for f in os.listdir(os.path.join(d, "run"))
               if f.startswith("model.ckpt-") and f.endswith(".index"))
check(ckpts and ckpts[-1] >= 2000, f"the chief's checkpoints {ckpts}")
check(s["replay"] == "foreman chaos --preset cluster --seed 165 -- " + " ".join(r["train_flags"]), s["replay"])
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
EOF
# No task left: no process runs with the seed's directory in its command line.
left=$(pgrep -f -- "$work/seed-165" || true)
[[ -z $left ]] || fail "processes left: $left"

# 3. A seed that must fail: --timeout-secs 1 under a job far longer -> every
#    task's group is killed at 1 s: `bounded` and `finished` FAIL, exit 1,
#    the replay command printed, no task left.
work3=$tmp/work3
"$foreman" chaos --preset cluster --seed 0 --timeout-secs 1 --work-dir "$work3" -- --max-steps 1000000 \
  --hidden 16 --batch-size 50 --threads 1 --eval-every-steps 0 >"$tmp/chaos3.out" 2>&1 &
chaos_pid=$!
pids+=("$chaos_pid")
wait_bounded "$chaos_pid" 60
out=$(cat "$tmp/chaos3.out")
[[ $rc -eq 1 ]] || fail "a 1 s timeout: exit $rc, want 1: $out"
has "bounded: .* did not end within --timeout-secs 1" "$out" && has "finished: " "$out" \
  || fail "a 1 s timeout: bounded and finished did not fail: $out"
has "replay: foreman chaos --preset cluster --seed 0 --timeout-secs 1 -- --max-steps 1000000" "$out" \
  || fail "a 1 s timeout: no replay command: $out"
left=$(pgrep -f -- "$work3/seed-0" || true)
[[ -z $left ]] || fail "processes left after the timeout: $left"

# 4. Partitions (seed 322 of a 1000-step job, where network namespaces can
#    be made: cut the ps off at the chief's step 116 for 1.313 s, then SIGKILL
#    the ps at step 233, restart it 0.65 s later in the same namespace): both
#    events fire, the chief recovers from each (two "Recovery: waiting"
#    lines), every task's last run exits 0 (the partitioned ps rejoins: 0),
#    the invariants hold, no task and no namespace holder is left. Where
#    namespaces cannot be made, the plan holds no partition and the report
#    says why. Synchronous training (--replicas-to-aggregate 2): each step
#    needs both workers' gradients, so worker 1 cannot train the job to its
#    end while the chief recovers from the cut; asynchronously, on a loaded
#    machine it did, and the kill planned at the chief's step 233 never fired.
work4=$tmp/work4
holders_before=$(pgrep -fx "sleep 3600" | sort)
"$foreman" chaos --preset cluster --seed 322 --work-dir "$work4" --keep --json "$tmp/report4.json" -- \
  --max-steps 1000 --hidden 16 --batch-size 50 --threads 1 --eval-every-steps 0 --replicas-to-aggregate 2 \
  >"$tmp/chaos4.out" 2>&1 &
chaos_pid=$!
pids+=("$chaos_pid")
wait_bounded "$chaos_pid" 60
out=$(cat "$tmp/chaos4.out")
[[ $rc -eq 0 ]] || fail "seed 322: exit $rc: $out"
if unshare -rn ip link add fa type veth peer name fb 2>/dev/null; then
  has "^partition: available" "$out" && has "partition: 1 fired" "$out" || fail "seed 322: partition not available or not fired: $out"
  "$py" - "$tmp/report4.json" "$work4/seed-322" <<'EOF' || fail "seed 322's JSON report or logs: $out"
import json, os, sys
r = json.load(open(sys.argv[1]))
d = sys.argv[2]
bad = []
def check(cond, what):
    if not cond:
        bad.append(what)
s = r["seeds"][0]
check(r["partition"] == "available" and r["ok"], f"partition {r['partition']}, ok {r['ok']}")
ev = [(e.get("partition"), e.get("kill"), e["at_chief_step"], e.get("heal_after_ms"), e.get("restart_after_ms"))
      for e in s["plan"]["events"]]
check(ev == [("ps", None, 116, 1313, None), (None, "ps", 233, None, 650)], f"seed 322's plan changed: {ev}")
check(s["faults_fired"] == ["e0", "e1"] and s["partitions"] == 1 and s["restarts"] == 1,
      f"fired {s['faults_fired']}, partitions {s['partitions']}, restarts {s['restarts']}")
for name in ("checkpoints_verify", "global_step", "bounded", "finished"):
    check(s["invariants"][name]["ok"], f"{name}: {s['invariants'][name]}")
runs = {(x["task"], x["n"]): x["exit_code"] for x in s["runs"]}
check(runs == {("ps", 0): 137, ("ps", 1): 0, ("worker 1", 0): 0, ("chief", 0): 0}, f"runs {runs}")
chief = open(os.path.join(d, "chief-0.log")).read()
check(chief.count("Recovery: waiting") == 2, "the chief did not see the ps lost twice (the cut, the kill)")
check(chief.count("Recovered from a preemption error") == 2, "the chief did not recover twice")
check("--ps-hosts 10.213.0.2:" in chief, "the ps did not run in namespace B")
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
EOF
else
  echo "SKIP part 4's partition: cannot make network namespaces here (unshare -rn ip link add ... type veth)"
  has "^partition: not available here \(" "$out" || fail "seed 322: the report does not say why partitions are not available: $out"
  grep -q '"partition": "ps"' "$work4/seed-322/plan.json" && fail "seed 322's plan holds a partition where none can be made"
fi
left=$(pgrep -f -- "$work4/seed-322" || true)
[[ -z $left ]] || fail "processes left after seed 322: $left"
holders_after=$(pgrep -fx "sleep 3600" | sort)
left=$(comm -13 <(echo "$holders_before") <(echo "$holders_after") | tr '\n' ' ')
[[ -z ${left// /} ]] || fail "namespace holders left after seed 322: $left"

if ((failures > 0)); then
  failures_summary
  exit 1
fi
echo "PASS: chaos --preset cluster: bad flags refused; seed 165 (ps kill, worker kill) holds its invariants; a hang fails; seed 322 (ps partition, ps kill) holds its invariants"
