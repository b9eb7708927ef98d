#!/usr/bin/env bash
# Every mutant of the mutation suite (tools/mutants/*.patch, applied by
# tools/scripts/mutation-check.sh) still applies exactly to this tree: a
# change to the code a mutant plants its bug in must update the patch, or the
# suite would report the mutant as an ERROR instead of proving the checker.
# Usage: mutants_apply_test.sh SOURCE_ROOT
set -u
root=${1:?usage: mutants_apply_test.sh SOURCE_ROOT}
failures=0 n=0
for p in "$root"/tools/mutants/*.patch; do
  n=$((n + 1))
  if ! out=$(patch --dry-run --batch --forward --fuzz=0 --silent -p1 -d "$root" -i "$p" 2>&1); then
    echo "FAIL: $(basename "$p") no longer applies to the tree (patch --forward --fuzz=0; one already applied fails too): $out"
    failures=$((failures + 1))
  fi
done
((n >= 8)) || { echo "FAIL: $n mutants in $root/tools/mutants (the suite has 8)"; exit 1; }
echo "$n mutants, $failures that do not apply"
((failures == 0))
