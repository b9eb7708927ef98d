#!/usr/bin/env bash
# The chaos soak (issue 14, docs/reliability.md): `foreman chaos` over many
# seeds of each preset, outside CI, and one table of what it found.
#
# Usage: tools/scripts/chaos_soak.sh [--seeds N] [--first-seed K] [--presets all,steps,...]
#                                    [--jobs J] [--build-dir DIR] [--out DIR] [-- train flags]
#   --seeds       seeds per preset (default 1000)
#   --first-seed  the first seed (default 0)
#   --presets     comma-separated (default all,disk,steps,signals)
#   --jobs        chaos processes at once, each on its own slice of the seeds
#                 (default 1; each process runs one foreman train at a time)
#   --build-dir   a release build (default build-release, built when missing)
#   --out         where the JSON reports, logs, table.md and a frozen copy of the
#                 binaries (bin/) go (default a new
#                 directory under ${TMPDIR:-/tmp})
# Prints table.md: per preset, seeds, failed seeds, faults planned / fired,
# process restarts, in-process recoveries, steps lost, seconds per seed (mean,
# max), and every failing seed's replay command. Exit 0 when no seed failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
seeds=1000
first=0
presets=all,disk,steps,signals
jobs=1
build_dir=build-release
out=
train_flags=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seeds) seeds=$2; shift 2 ;;
    --first-seed) first=$2; shift 2 ;;
    --presets) presets=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; train_flags=("$@"); break ;;
    *) echo "chaos_soak.sh: unknown argument '$1' (see the top of $0)" >&2; exit 2 ;;
  esac
done
for n in "$seeds" "$first" "$jobs"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "chaos_soak.sh: '$n' is not a non-negative integer" >&2; exit 2; }
done
[[ $seeds -ge 1 && $jobs -ge 1 ]] || { echo "chaos_soak.sh: --seeds and --jobs must be >= 1" >&2; exit 2; }
if [[ ! -x $build_dir/tools/foreman ]]; then
  tools/scripts/build.sh release >/dev/null || { echo "chaos_soak.sh: the release build failed" >&2; exit 1; }
  build_dir=build-release
fi
[[ -n $out ]] || out=$(mktemp -d "${TMPDIR:-/tmp}/chaos-soak.XXXXXX")
mkdir -p "$out" || exit 1
# A frozen copy of the binaries (foreman finds libforeman at $ORIGIN/../src):
# a rebuild of the build directory during a soak of an hour would otherwise
# swap libforeman under running jobs, and every later seed would fail.
mkdir -p "$out/bin/tools" "$out/bin/src" || exit 1
cp "$build_dir/tools/foreman" "$out/bin/tools/" || { echo "chaos_soak.sh: cannot copy $build_dir/tools/foreman" >&2; exit 1; }
for lib in "$build_dir"/src/libforeman*; do
  [[ -d $lib ]] && continue  # meson's object directories
  cp -P "$lib" "$out/bin/src/" || { echo "chaos_soak.sh: cannot copy $lib" >&2; exit 1; }
done
foreman=$(cd "$out/bin/tools" && pwd)/foreman
echo "foreman: $("$foreman" --version 2>&1 | head -1) (git $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
echo "chaos soak: $seeds seeds from $first of ${presets//,/ }, $jobs at once; reports in $out"

IFS=, read -r -a preset_list <<<"$presets"
reports=()
for preset in "${preset_list[@]}"; do
  per=$(( (seeds + jobs - 1) / jobs ))
  pids=()
  for ((j = 0; j < jobs; ++j)); do
    start=$((first + j * per))
    count=$(( seeds - j * per < per ? seeds - j * per : per ))
    [[ $count -gt 0 ]] || continue
    json=$out/$preset-$start.json
    reports+=("$preset:$json")
    "$foreman" chaos --preset "$preset" --seeds "$count" --first-seed "$start" --json "$json" \
      --work-dir "$out/$preset-$start" ${train_flags[@]+-- "${train_flags[@]}"} >"$out/$preset-$start.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  # Passing seeds' runs are not needed: keep the failing ones' logs.
  for ((j = 0; j < jobs; ++j)); do
    start=$((first + j * per))
    /usr/bin/python3 - "$out/$preset-$start.json" "$out/$preset-$start" <<'PY' || true
import json, os, shutil, sys
try:
    report = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(0)
for s in report.get("seeds", []):
    if s.get("ok"):
        shutil.rmtree(os.path.join(sys.argv[2], "seed-%d" % s["seed"]), ignore_errors=True)
PY
  done
done

/usr/bin/python3 - "$out/table.md" "${reports[@]}" <<'PY'
import collections, json, sys
rows = collections.OrderedDict()
failures = []
missing = []
for arg in sys.argv[2:]:
    preset, path = arg.split(":", 1)
    r = rows.setdefault(preset, dict(seeds=0, failed=0, planned=0, fired=0, restarts=0, recoveries=0,
                                     lost=0, secs=[], broken=[]))
    try:
        report = json.load(open(path))
    except (OSError, ValueError) as e:
        log = path[:-len(".json")] + ".log"
        try:
            said = [l.strip() for l in open(log) if l.strip()][-1]
        except (OSError, IndexError):
            said = "no log"
        missing.append("%s (%s); %s: %s" % (path, e, log, said))
        continue
    for s in report["seeds"]:
        r["seeds"] += 1
        r["planned"] += s["faults_planned"]
        r["fired"] += len(s["faults_fired"])
        r["restarts"] += s["restarts"]
        # A cluster preset's seeds report neither (its processes are the
        # cluster's tasks): "n/a" in the table, not a false 0.
        for key, col in (("in_process_recoveries", "recoveries"), ("steps_lost", "lost")):
            if key in s and r[col] is not None:
                r[col] += s[key]
            else:
                r[col] = None
        r["secs"].append(s["elapsed_ms"] / 1000.0)
        if not s["ok"]:
            r["failed"] += 1
            bad = [k for k, v in sorted(s["invariants"].items()) if not v["ok"]]
            failures.append("%s seed %d: %s -- replay: %s" % (preset, s["seed"], ", ".join(bad), s["replay"]))
lines = ["| preset | seeds | failed | faults planned | faults fired | process restarts | in-process recoveries "
         "| steps lost | s/seed mean | s/seed max |",
         "|---|---|---|---|---|---|---|---|---|---|"]
for preset, r in rows.items():
    secs = r["secs"] or [0]
    na = lambda v: "n/a" if v is None else str(v)
    lines.append("| %s | %d | %d | %d | %d | %d | %s | %s | %.2f | %.2f |" % (
        preset, r["seeds"], r["failed"], r["planned"], r["fired"], r["restarts"], na(r["recoveries"]), na(r["lost"]),
        sum(secs) / len(secs), max(secs)))
if failures:
    lines += ["", "Failing seeds:"] + ["- " + f for f in failures]
if missing:
    lines += ["", "Reports missing (a chaos process failed to start or crashed; see its .log):"] + ["- " + m for m in missing]
text = "\n".join(lines) + "\n"
open(sys.argv[1], "w").write(text)
print(text, end="")
sys.exit(1 if failures or missing else 0)
PY
