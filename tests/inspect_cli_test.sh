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
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/inspect_cli_test.XXXXXX") || { echo "cannot create a temporary directory under ${TEST_TMPDIR:-/tmp}" >&2; exit 1; }
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

# write_hex FILE HEX: FILE holds the bytes HEX spells.
write_hex() { printf "$(sed 's/../\\x&/g' <<<"$2")" >"$1"; }

# A dtype Foreman cannot decode (DT_HALF, 19): listed under TF's name, and its
# raw CRC32C still checked. Index built by hand: h float16 [2] = {1, 2}.
mkdir "$tmp/half"
write_hex "$tmp/half/m.index" 00000608011a02080100010f680813120412020802280435c267f736000000000900000002000000005f17c7ab000000000100000000c0f2a1b000020268ff0028000000000100000000e08f3b5d2d083a0f00000000000000000000000000000000000000000000000000000000000000000000000057fb808b247547db
write_hex "$tmp/half/m.data-00000-of-00001" 003c0040
out=$("$foreman" inspect "$tmp/half/m" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "float16 bundle exited $rc: $out"
has '^h +float16 +\[2\]$' "$out" || fail "float16 line: $out"
write_hex "$tmp/half/m.data-00000-of-00001" 003c0041
out=$("$foreman" inspect "$tmp/half/m" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "corrupt float16 data exited $rc, want 2: $out"
has "$tmp/half/m.data-00000-of-00001: variable 'h': crc32c mismatch" "$out" || fail "corrupt float16 message: $out"

# A consistent entry too big for memory: float32 [2^41] in an 8 TiB sparse
# data file. RESOURCE_EXHAUSTED naming file and variable, exit 2. Skipped
# where the kernel overcommits memory (the allocation could then succeed).
mkdir "$tmp/huge"
write_hex "$tmp/huge/m.index" 00000608011a02080100011a7608011209120708808080808040288080808080800235000000000000000009000000020000000099e731b8000000000100000000c0f2a1b000020276ff0033000000000100000000cfb1ace93808450f00000000000000000000000000000000000000000000000000000000000000000000000057fb808b247547db
if [[ $(cat /proc/sys/vm/overcommit_memory 2>/dev/null) == 1 ]]; then
  echo "skipping the huge-entry check: vm.overcommit_memory is 1"
elif ! truncate -s 8796093022208 "$tmp/huge/m.data-00000-of-00001" 2>/dev/null; then
  echo "skipping the huge-entry check: no 8 TiB sparse files in $tmp"
else
  out=$(ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1" \
        "$foreman" inspect "$tmp/huge/m" 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "huge entry exited $rc, want 2: $out"
  has "$tmp/huge/m.data-00000-of-00001: variable 'v': cannot allocate 8796093022208 bytes for float32\[2199023255552\]" \
      "$out" || fail "huge entry message: $out"
fi

# --max-values takes a non-negative integer; the error says so plainly.
out=$("$foreman" inspect "$dir" --max-values -3 2>&1); rc=$?
[[ $rc -ne 0 ]] || fail "--max-values -3 exited 0"
has '2147483647' "$out" || fail "--max-values -3 message: $out"
has '[0-9]{20}' "$out" && fail "--max-values -3 prints a huge number: $out"

# A tensor name from the file stays on its line (issue 30 point 6).
hostile=$("$writer" "$tmp/hostile" --hostile) || fail "writer --hostile: $hostile"
out=$("$foreman" inspect "$hostile" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "inspect on a hostile name exited $rc: $out"
has '^evil\\n\\x1b\[2Jname\\xff +float32 +\[\]$' "$out" || fail "the hostile name is not escaped on one line: $out"
if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f\x80-\xff]' <<<"$out"; then fail "a control or non-ASCII byte reached the terminal: $out"; fi

if ((failures > 0)); then echo "$failures failure(s)"; exit 1; fi
echo "inspect_cli: all checks passed"
