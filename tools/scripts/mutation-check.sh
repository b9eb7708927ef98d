#!/usr/bin/env bash
# The mutation suite (docs/reliability.md, "The mutation suite"): proves that
# `foreman chaos` catches the durability bugs it exists for. Each mutant is
# one small source patch kept in tools/mutants/ (a planted bug: a skipped
# fsync, a state file written too early, a restore of the wrong
# checkpoint, ...). For each, this script applies it to a scratch worktree
# of HEAD, builds only `foreman` there (one build directory, reused: a
# mutant recompiles its own files and relinks), and soaks it: --preset power
# (power loss, --disk sim) first, then --preset all on the real disk, in
# chunks of seeds, until a seed fails or --seeds of each ran. It prints per
# mutant: caught or not, by which preset and invariant, after how many seeds.
#
# Usage: tools/scripts/mutation-check.sh [--seeds N] [--chunk K] [--presets LIST] [--work DIR] [--keep] [MUTANT...]
#   MUTANT   names of tools/mutants/<name>.patch (default: all of them)
#   --presets the presets to soak with, in order, comma-separated (default
#            power,all; e.g. "all" alone: how the real-disk presets fare)
#   --seeds  seeds per preset at most (default 200: the issue's goal)
#   --chunk  seeds per chaos call (default 25)
#   --work   scratch directory (default: a new one under $TMPDIR or /tmp,
#            removed at the end unless --keep)
# Exit: 0 every mutant caught, 1 one was not (or a build failed), 2 bad usage.
# Needs: git, meson, ninja (tools/scripts/install-deps.sh); a first build of
# the scratch tree takes as long as a release build (ccache makes it short).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seeds=200
chunk=25
work=""
keep=0
mutants=()
presets=power,all
usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --seeds) seeds=${2:?--seeds needs a number}; shift 2 ;;
    --chunk) chunk=${2:?--chunk needs a number}; shift 2 ;;
    --presets) presets=${2:?--presets needs a list}; shift 2 ;;
    --work) work=${2:?--work needs a directory}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage ;;
    -*) echo "mutation-check.sh: unknown flag $1" >&2; usage ;;
    *) mutants+=("$1"); shift ;;
  esac
done
[[ $seeds =~ ^[1-9][0-9]*$ && $chunk =~ ^[1-9][0-9]*$ ]] || { echo "mutation-check.sh: --seeds and --chunk take positive numbers" >&2; exit 2; }
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
if [[ ! -d $src ]]; then
  git -C "$root" worktree add --detach "$src" HEAD >/dev/null || { echo "mutation-check.sh: cannot make a worktree at $src" >&2; exit 1; }
fi
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build" "$src" -Dbuildtype=release -Dwerror=true -Dpkgconfig.relocatable=true >"$work/setup.log" 2>&1 ||
    { echo "mutation-check.sh: meson setup failed: $work/setup.log" >&2; exit 1; }
fi
py=/usr/bin/python3

# The first failing seed of a report, and its failed invariants ("" when none failed).
first_failure() {
  "$py" - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for s in r["seeds"]:
    if not s["ok"]:
        bad = [k for k, v in s["invariants"].items() if not v["ok"]]
        print(s["seed"], ",".join(sorted(bad)))
        break
PY
}

# Soaks $1 (a foreman binary) with preset $2 in chunks; prints "<seed> <invariants>" of the first failure.
soak() {
  local bin=$1 preset=$2 first=0 n json out
  while [[ $first -lt $seeds ]]; do
    n=$(( seeds - first < chunk ? seeds - first : chunk ))
    json=$work/report.json
    rm -f "$json"
    out=$("$bin" chaos --preset "$preset" --seeds "$n" --first-seed "$first" --json "$json" --work-dir "$work/chaos" 2>&1)
    if [[ ! -s $json ]]; then
      # The fault-free run itself failed (the mutant broke the job outright): caught at once.
      echo "$first fault-free-run: $(tail -1 <<<"$out" | cut -c1-200)"
      return
    fi
    local f
    f=$(first_failure "$json")
    if [[ -n $f ]]; then echo "$f"; return; fi
    first=$(( first + n ))
  done
}

caught=0
missed=0
printf '%-28s %-8s %-10s %s\n' mutant caught seeds "by (preset: invariants)"
for m in "${mutants[@]}"; do
  git -C "$src" checkout -q -- . && git -C "$src" clean -qfd -e build-mutation >/dev/null
  if ! git -C "$src" apply "$root/tools/mutants/$m.patch"; then
    printf '%-28s %-8s %-10s %s\n' "$m" ERROR - "the patch does not apply to HEAD"
    missed=$((missed + 1)); continue
  fi
  if ! ninja -C "$build" tools/foreman >"$work/build-$m.log" 2>&1; then
    printf '%-28s %-8s %-10s %s\n' "$m" ERROR - "build failed: $work/build-$m.log"
    missed=$((missed + 1)); continue
  fi
  bin=$build/tools/foreman   # the mutants run one at a time: nothing relinks it under a soak
  result=""
  for preset in ${presets//,/ }; do
    r=$(soak "$bin" "$preset")
    if [[ -n $r ]]; then
      read -r seed why <<<"$r"
      result="$preset: $why"
      break
    fi
  done
  if [[ -n $result ]]; then
    printf '%-28s %-8s %-10s %s\n' "$m" yes "$((seed + 1))" "$result"
    caught=$((caught + 1))
  else
    printf '%-28s %-8s %-10s %s\n' "$m" NO "$seeds" "not caught by $presets"
    missed=$((missed + 1))
  fi
done
git -C "$src" checkout -q -- .
echo "$caught caught, $missed not caught (of ${#mutants[@]} mutants; up to $seeds seeds per preset)"
[[ $missed -eq 0 ]]
