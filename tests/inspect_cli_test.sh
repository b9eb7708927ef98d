#!/usr/bin/env bash
# `foreman inspect`: names, dtypes, shapes, values and stats of a checkpoint
# written by tests/support/write_sample_checkpoint.cpp; exit 2 naming the file
# for a missing or corrupt checkpoint.
# Usage: inspect_cli_test.sh FOREMAN WRITE_SAMPLE_CHECKPOINT
set -u
foreman=$1
writer=$2
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/inspect_cli_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
dir=$tmp/ckpt

prefix=$("$writer" "$dir") || { echo "FAIL: writer: $prefix"; exit 1; }
[[ $prefix == "$dir/model.ckpt-42" ]] || fail "writer printed '$prefix'"

# has LINE_REGEX TEXT: some line of TEXT matches the extended regex.
has() { grep -Eq -- "$1" <<<"$2"; }

out=$("$foreman" inspect "$dir" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "inspect DIR exited $rc: $out"
has "^checkpoint $dir/model.ckpt-42\$" "$out" || fail "no checkpoint line: $out"
has '^dense/bias +float64 +\[3\]$' "$out" || fail "dense/bias line: $out"
has '^dense/kernel +float32 +\[2,3\]$' "$out" || fail "dense/kernel line: $out"
has '^embedding/ids +int32 +\[12\]$' "$out" || fail "embedding/ids line: $out"
has '^global_step +int64 +\[\]$' "$out" || fail "global_step line: $out"
has '^mask +uint8 +\[4\]$' "$out" || fail "mask line: $out"
has '^vocab +string +\[3\]$' "$out" || fail "vocab line: $out"
[[ $(wc -l <<<"$out") -eq 7 ]] || fail "expected 7 lines: $out"
has 'values' "$out" && fail "values printed without --values: $out"

out=$("$foreman" inspect "$dir" --values 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "--values exited $rc: $out"
has '^  values: \{1, 2, 3, 4, 5, 6\}$' "$out" || fail "kernel values: $out"
has '^  values: \{0.5, -1.5, 2\}$' "$out" || fail "bias values: $out"
has '^  values: \{42\}$' "$out" || fail "global_step value: $out"
has '^  values: \{0, 1, 254, 255\}$' "$out" || fail "uint8 values: $out"
has '^  values: \{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, \.\.\. \(2 more\)\}$' "$out" || fail "default elision after 10: $out"
has '^  values: \{"a", "", "x{200}"\}$' "$out" || fail "string values: $out"

out=$("$foreman" inspect "$dir" --values --max-values 3 --name embedding/ids 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "--max-values exited $rc: $out"
[[ $out == "checkpoint $dir/model.ckpt-42"$'\n'"embedding/ids  int32    [12]"$'\n'"  values: {0, 1, 2, ... (9 more)}" ]] ||
  fail "--name/--max-values output: $out"

out=$("$foreman" inspect "$dir" --stats 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "--stats exited $rc: $out"
has '^  stats: min 1  max 6  mean 3.5$' "$out" || fail "kernel stats: $out"
has '^  stats: min -1.5  max 2  mean 0.3333333333333333$' "$out" || fail "bias stats: $out"
has '^  stats: min 0  max 11  mean 5.5$' "$out" || fail "ids stats: $out"
has '^  stats: not numeric$' "$out" || fail "string stats: $out"

out=$("$foreman" inspect "$dir/model.ckpt-41" --name global_step --values 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "inspect PREFIX exited $rc: $out"
has '^  values: \{41\}$' "$out" || fail "step 41 value: $out"
out=$("$foreman" inspect "$dir/model.ckpt-41.index" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "inspect PREFIX.index exited $rc: $out"

out=$("$foreman" inspect "$dir" --name nope 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "--name nope exited $rc, want 2"
has "nope" "$out" || fail "--name nope message: $out"

out=$("$foreman" inspect "$tmp/missing" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "missing dir exited $rc, want 2"
has "$tmp/missing" "$out" || fail "missing dir message does not name it: $out"

mkdir "$tmp/empty"
out=$("$foreman" inspect "$tmp/empty" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "empty dir exited $rc, want 2"
has "no checkpoint in directory $tmp/empty" "$out" || fail "empty dir message: $out"

# Corrupt the first byte of step 42's data: dense/bias (0.5 as float64 starts with 0x00).
data=$dir/model.ckpt-42.data-00000-of-00001
printf '\xff' | dd of="$data" bs=1 seek=0 count=1 conv=notrunc status=none
out=$("$foreman" inspect "$dir/model.ckpt-42" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "corrupt data exited $rc, want 2: $out"
has "$data: variable 'dense/bias': crc32c mismatch" "$out" || fail "corrupt data message: $out"
out=$("$foreman" inspect "$dir" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "inspect DIR with a corrupt latest exited $rc: $out"
has "^checkpoint $dir/model.ckpt-41\$" "$out" || fail "no fallback to step 41 (decision 7): $out"

if ((failures > 0)); then echo "$failures failure(s)"; exit 1; fi
echo "inspect_cli: all checks passed"
