#!/usr/bin/env bash
# Build step of tests/meson.build's mutation_smallest: applies a mutant patch
# (tools/mutants/*.patch) to a copy of the one source file it changes.
#   apply_mutant.sh PATCH SOURCE OUTPUT NAME
# NAME: SOURCE's path in the tree, which must be the only file the patch
# changes. Exact context only (no fuzz): a patch that no longer applies to
# the tree fails the build with a message naming it.
set -u
patch_file=$1 source=$2 output=$3 name=$4
files=$(grep -E '^\+\+\+ ' "$patch_file" | sed -E 's#^\+\+\+ (b/)?##; s#[[:space:]].*$##' | sort -u)
if [[ $files != "$name" ]]; then
  echo "apply_mutant.sh: $patch_file changes '$(echo $files)', not only $name" >&2
  exit 1
fi
rm -f "$output" "$output.rej"
if ! log=$(patch --batch --fuzz=0 --silent -r - -o "$output" -i "$patch_file" "$source" 2>&1); then
  rm -f "$output"
  echo "apply_mutant.sh: the mutant $patch_file no longer applies to $name: update the patch (tools/scripts/mutation-check.sh uses it too)" >&2
  [[ -n $log ]] && echo "$log" >&2
  exit 1
fi
