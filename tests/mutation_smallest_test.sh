#!/usr/bin/env bash
# The mutation suite's smallest case (docs/fault-injection.md, "The mutation
# suite"): foreman_mutant_skip_data_sync is `foreman` with
# tools/mutants/skip-data-sync.patch applied (the bundle's data file renamed
# into place without its fsync; built by tests/meson.build). A few seeds of
# --preset power must fail on it, by checkpoints_verify's check at a save
# reported durable, and the same seeds must hold on the real foreman: the
# checker catches the bug and only the bug.
#   mutation_smallest_test.sh MUTANT FOREMAN SEEDS
set -u
mutant=$(realpath "$1")
foreman=$(realpath "$2")
seeds=$3
data=/usr/share/datasets/fashion-mnist
py=/usr/bin/python3
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/mutation_smallest_test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
[[ -f $data/train-images-idx3-ubyte.gz ]] || { echo "FAIL: $data is missing (tools/scripts/install-deps.sh)"; exit 1; }

out=$(timeout 60 "$mutant" chaos --preset power --seeds "$seeds" --json "$tmp/mutant.json" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "the mutant: chaos exited $rc, not 1 (the mutant not caught?): $(tail -20 <<<"$out")"
"$py" - "$tmp/mutant.json" <<'PY' || fail "the mutant: the report does not name checkpoints_verify: $(grep -m3 checkpoints_verify <<<"$out")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] is False, r["ok"]
failed = [s for s in r["seeds"] if not s["ok"]]
assert failed, "no failed seed"
inv = failed[0]["invariants"]["checkpoints_verify"]
assert not inv["ok"], failed[0]["invariants"]
assert any("was reported durable" in d for d in inv["details"]), inv["details"]
PY
grep -Eq "checkpoints_verify: run [0-9]+: the save of step [0-9]+ was reported durable" <<<"$out" ||
  fail "the mutant: no durable-save finding in the output: $(tail -20 <<<"$out")"

out=$(timeout 60 "$foreman" chaos --preset power --seeds "$seeds" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "the real foreman: chaos exited $rc on the same seeds: $(tail -20 <<<"$out")"
grep -q "^$seeds seeds, 0 failed" <<<"$out" || fail "the real foreman: no '$seeds seeds, 0 failed': $(tail -5 <<<"$out")"

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "mutation_smallest: ok"
