#!/usr/bin/env bash
# The mutation suite (docs/fault-injection.md, "The mutation suite"): proves that
# `foreman chaos` catches the durability bugs it exists for. Each mutant is
# one small source patch kept in tools/mutants/ (a planted bug: a skipped
# fsync, a state file written too early, a restore of the wrong
# checkpoint, ...). For each, this script applies it to a scratch worktree
# of HEAD, builds only `foreman` there (one build directory, reused: a
# mutant recompiles its own files and relinks), and soaks it: --preset power
# (power loss, --disk sim) first, then --preset all on the real disk, in
# chunks of seeds, until a seed fails or --seeds of each ran. It prints per
# mutant: caught or not, by which preset and invariant, after how many seeds.
# A mutant counts as caught only when chaos exits 1 and its JSON report names
# a failed invariant; anything else (no report, a report that does not
# parse, another exit) is a failure of this script (exit 1, saying what).
# First, a control run: HEAD unmutated, the same presets and --control-seeds
# seeds, must hold every invariant (else the checker is flaky or HEAD is
# broken: nothing a mutant shows would mean anything).
#
# Usage: tools/scripts/mutation-check.sh [--seeds N] [--chunk K] [--control-seeds C] [--presets LIST] [--work DIR] [--keep] [MUTANT...]
#   MUTANT   names of tools/mutants/<name>.patch (default: all of them)
#   --presets the presets to soak with, in order, comma-separated (default
#            power,all; e.g. "all" alone: how the real-disk presets fare)
#   --seeds  seeds per preset at most (default 200: the issue's goal)
#   --chunk  seeds per chaos call (default 25)
#   --control-seeds seeds per preset of the unmutated control run (default 10)
#   --work   scratch directory (default: a new one under $TMPDIR or /tmp,
#            removed at the end unless --keep); a reused one's worktree is
#            checked out at the current HEAD (and cleaned) before each build
# Exit: 0 every mutant caught, 1 one was not (or a build, the control run or
# a chaos run's report failed), 2 bad usage.
# Needs: git, meson, ninja (tools/scripts/install-deps.sh); a first build of
# the scratch tree takes as long as a release build (ccache makes it short).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seeds=200
chunk=25
control_seeds=10
work=""
keep=0
mutants=()
presets=power,all
usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --seeds) seeds=${2:?--seeds needs a number}; shift 2 ;;
    --chunk) chunk=${2:?--chunk needs a number}; shift 2 ;;
    --control-seeds) control_seeds=${2:?--control-seeds needs a number}; shift 2 ;;
    --presets) presets=${2:?--presets needs a list}; shift 2 ;;
    --work) work=${2:?--work needs a directory}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage ;;
    -*) echo "mutation-check.sh: unknown flag $1" >&2; usage ;;
    *) mutants+=("$1"); shift ;;
  esac
done
[[ $seeds =~ ^[1-9][0-9]*$ && $chunk =~ ^[1-9][0-9]*$ && $control_seeds =~ ^[1-9][0-9]*$ ]] ||
  { echo "mutation-check.sh: --seeds, --chunk and --control-seeds take positive numbers" >&2; exit 2; }
if [[ ${#mutants[@]} -eq 0 ]]; then
  for p in "$root"/tools/mutants/*.patch; do mutants+=("$(basename "$p" .patch)"); done
fi
for m in "${mutants[@]}"; do
  [[ -f $root/tools/mutants/$m.patch ]] || { echo "mutation-check.sh: no mutant $m (tools/mutants/$m.patch)" >&2; exit 2; }
done
if [[ -z $work ]]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/foreman-mutants.XXXXXX") || exit 1
  [[ $keep -eq 1 ]] || trap 'git -C "$root" worktree remove --force "$work/src" >/dev/null 2>&1; rm -rf "$work"' EXIT
else
  mkdir -p "$work" || exit 1
fi
src=$work/src
build=$src/build-mutation
head=$(git -C "$root" rev-parse HEAD) || { echo "mutation-check.sh: $root has no HEAD" >&2; exit 1; }
if [[ ! -d $src ]]; then
  git -C "$root" worktree add --detach "$src" "$head" >/dev/null || { echo "mutation-check.sh: cannot make a worktree at $src" >&2; exit 1; }
fi
# The scratch tree at the current HEAD, unmutated (a reused --work keeps an
# old worktree: check HEAD out in it, drop what an earlier mutant left).
reset_tree() {
  git -C "$src" checkout -q -- . && git -C "$src" clean -qfd -e build-mutation >/dev/null &&
    git -C "$src" checkout -q --detach "$head" ||
    { echo "mutation-check.sh: cannot check out $head in $src" >&2; exit 1; }
}
reset_tree
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build" "$src" -Dbuildtype=release -Dwerror=true -Dpkgconfig.relocatable=true >"$work/setup.log" 2>&1 ||
    { echo "mutation-check.sh: meson setup failed: $work/setup.log" >&2; exit 1; }
fi
py=/usr/bin/python3

# The first failing seed of a report and its failed invariants ("" when
# every seed held); exit 1 when the report does not read as one.
first_failure() {
  "$py" - "$1" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    for s in r["seeds"]:
        if not s["ok"]:
            bad = [k for k, v in s["invariants"].items() if not v["ok"]]
            if not bad:
                sys.exit("seed %d failed, but its report names no failed invariant" % s["seed"])
            print(s["seed"], ",".join(sorted(bad)))
            break
except (OSError, ValueError, KeyError, TypeError) as e:
    sys.exit("the report does not read: %r" % (e,))
PY
}

# Soaks $1 (a foreman binary) with preset $2 over $3 seeds in chunks. Prints
# "<seed> <invariants>" of the first failure, nothing when every seed held;
# exit 1 (saying why on stderr) when a chaos run is not one of those two: a
# mutant counts as caught only by chaos's exit 1 with a report naming a
# failed invariant.
soak() {
  local bin=$1 preset=$2 total=$3 first=0 n json out rc f
  while [[ $first -lt $total ]]; do
    n=$(( total - first < chunk ? total - first : chunk ))
    json=$work/report.json
    rm -f "$json"
    out=$("$bin" chaos --preset "$preset" --seeds "$n" --first-seed "$first" --json "$json" --work-dir "$work/chaos" 2>&1)
    rc=$?
    if [[ $rc -ne 0 && $rc -ne 1 ]] || [[ ! -s $json ]]; then
      echo "chaos --preset $preset --seeds $n --first-seed $first exited $rc$([[ -s $json ]] || echo ", no JSON report"): $(tail -3 <<<"$out" | cut -c1-300)" >&2
      return 1
    fi
    f=$(first_failure "$json") || { echo "chaos --preset $preset (seeds from $first): $json: see above" >&2; return 1; }
    if [[ $rc -eq 1 && -n $f ]]; then echo "$f"; return 0; fi
    if [[ $rc -eq 1 || -n $f ]]; then
      echo "chaos --preset $preset (seeds from $first) exited $rc, but its report says $([[ -n $f ]] && echo "seed ${f%% *} failed" || echo "every seed held")" >&2
      return 1
    fi
    first=$(( first + n ))
  done
}

# The control run: HEAD unmutated holds every invariant.
if ! ninja -C "$build" tools/foreman >"$work/build-control.log" 2>&1; then
  echo "mutation-check.sh: the unmutated build failed: $work/build-control.log" >&2; exit 1
fi
for preset in ${presets//,/ }; do
  if ! r=$(soak "$build/tools/foreman" "$preset" "$control_seeds"); then
    echo "mutation-check.sh: the control run (HEAD unmutated, --preset $preset) did not complete: stopped" >&2; exit 1
  fi
  if [[ -n $r ]]; then
    echo "mutation-check.sh: the control run (HEAD $head unmutated) failed seed ${r%% *} of --preset $preset (${r#* }): the checker is flaky or HEAD is broken; stopped" >&2
    exit 1
  fi
done
echo "control: HEAD unmutated holds every invariant ($control_seeds seeds of each of $presets)"

caught=0
missed=0
printf '%-32s %-8s %-10s %s\n' mutant caught seeds "by (preset: invariants)"
for m in "${mutants[@]}"; do
  reset_tree
  if ! git -C "$src" apply "$root/tools/mutants/$m.patch"; then
    printf '%-32s %-8s %-10s %s\n' "$m" ERROR - "the patch does not apply to HEAD"
    missed=$((missed + 1)); continue
  fi
  if ! ninja -C "$build" tools/foreman >"$work/build-$m.log" 2>&1; then
    printf '%-32s %-8s %-10s %s\n' "$m" ERROR - "build failed: $work/build-$m.log"
    missed=$((missed + 1)); continue
  fi
  bin=$build/tools/foreman   # the mutants run one at a time: nothing relinks it under a soak
  result=""
  for preset in ${presets//,/ }; do
    if ! r=$(soak "$bin" "$preset" "$seeds"); then
      result=error
      break
    fi
    if [[ -n $r ]]; then
      read -r seed why <<<"$r"
      result="$preset: $why"
      break
    fi
  done
  if [[ $result == error ]]; then
    printf '%-32s %-8s %-10s %s\n' "$m" ERROR - "a chaos run did not give a verdict (above): not counted as caught"
    missed=$((missed + 1))
  elif [[ -n $result ]]; then
    printf '%-32s %-8s %-10s %s\n' "$m" yes "$((seed + 1))" "$result"
    caught=$((caught + 1))
  else
    printf '%-32s %-8s %-10s %s\n' "$m" NO "$seeds" "not caught by $presets"
    missed=$((missed + 1))
  fi
done
reset_tree
echo "$caught caught, $missed not caught (of ${#mutants[@]} mutants; up to $seeds seeds per preset)"
[[ $missed -eq 0 ]]
