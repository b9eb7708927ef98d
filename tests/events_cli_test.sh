#!/usr/bin/env bash
# `foreman events`: prints what write_sample_events wrote, as text and as JSON
# lines; --tag filters; a cut tail is tolerated; a damaged record prints the
# records before it, then exits 2 naming file and offset; a log directory's
# subdirectories with event files are runs; a missing path and a directory
# without event files exit 2 naming them.
#   events_cli_test.sh FOREMAN WRITE_SAMPLE_EVENTS
set -u
foreman=$1
write_sample_events=$2
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

root=${TEST_TMPDIR:-/tmp}
mkdir -p "$root"
work=$(mktemp -d "$root/events_cli.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT

"$write_sample_events" "$work/run" || { echo "FAIL: write_sample_events exited $?"; exit 1; }
files=("$work"/run/events.out.tfevents.*)
[[ ${#files[@]} -eq 1 && ${files[0]} =~ /events\.out\.tfevents\.1700000000\.testhost$ ]] ||
  fail "unexpected event files: ${files[*]}"
file=${files[0]}

# -- text ------------------------------------------------------------------------
expected_text='step 0  wall 1700000000.000  file_version  brain.Event:2
step 0  wall 1700000000.000  session_log  START
step 1  wall 1700000000.500  scalar  loss = 0.25
step 1  wall 1700000000.500  histogram  weights  num 5  min -3  max 2  mean 0.2
step 1  wall 1700000000.500  text  note = "say \"hi\"\n\001 ✓"
step 2  wall 1700000001.000  scalar  loss = 0.125
step 2  wall 1700000001.000  session_log  CHECKPOINT  checkpoint_path /ckpt/model.ckpt-2
step 0  wall 1700000001.000  session_log  STOP'
for path in "$work/run" "$file"; do
  out=$("$foreman" events "$path" 2>&1); rc=$?
  [[ $rc -eq 0 ]] || fail "events $path exited $rc: $out"
  [[ $out == "$expected_text" ]] || fail "events $path printed:
$out
expected:
$expected_text"
done

out=$("$foreman" events --tag loss "$work/run" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "events --tag exited $rc: $out"
[[ $out == 'step 1  wall 1700000000.500  scalar  loss = 0.25
step 2  wall 1700000001.000  scalar  loss = 0.125' ]] || fail "events --tag loss printed: $out"

# -- JSON lines ------------------------------------------------------------------
f="\"file\":\"$file\""
expected_json="{$f,\"wall_time\":1700000000,\"step\":0,\"kind\":\"file_version\",\"file_version\":\"brain.Event:2\"}
{$f,\"wall_time\":1700000000,\"step\":0,\"kind\":\"session_log\",\"status\":\"START\",\"checkpoint_path\":\"\",\"msg\":\"\"}
{$f,\"wall_time\":1700000000.5,\"step\":1,\"kind\":\"scalar\",\"tag\":\"loss\",\"value\":0.25}
{$f,\"wall_time\":1700000000.5,\"step\":1,\"kind\":\"histogram\",\"tag\":\"weights\",\"num\":5,\"min\":-3,\"max\":2,\"mean\":0.2,\"sum\":1}
{$f,\"wall_time\":1700000000.5,\"step\":1,\"kind\":\"text\",\"tag\":\"note\",\"plugin\":\"text\",\"value\":\"say \\\"hi\\\"\\n\\u0001 ✓\"}
{$f,\"wall_time\":1700000001,\"step\":2,\"kind\":\"scalar\",\"tag\":\"loss\",\"value\":0.125}
{$f,\"wall_time\":1700000001,\"step\":2,\"kind\":\"session_log\",\"status\":\"CHECKPOINT\",\"checkpoint_path\":\"/ckpt/model.ckpt-2\",\"msg\":\"\"}
{$f,\"wall_time\":1700000001,\"step\":0,\"kind\":\"session_log\",\"status\":\"STOP\",\"checkpoint_path\":\"\",\"msg\":\"\"}"
out=$("$foreman" events --json "$work/run" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "events --json exited $rc: $out"
[[ $out == "$expected_json" ]] || fail "events --json printed:
$out
expected:
$expected_json"
if command -v python3 >/dev/null; then
  python3 -c 'import json, sys; [json.loads(line) for line in sys.stdin]' <<<"$out" ||
    fail "events --json is not JSON lines"
fi

# -- a cut tail (a writer still appending) is not an error -------------------------
mkdir "$work/cut"
head -c -3 "$file" >"$work/cut/events.out.tfevents.1700000000.cut"
out=$("$foreman" events "$work/cut" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "events on a cut file exited $rc: $out"
[[ $out == "${expected_text%$'\n'*}" ]] || fail "events on a cut file printed: $out"

# -- bad input exits 2 and names it -------------------------------------------------
corrupt="$work/corrupt/events.out.tfevents.1700000000.bad"
mkdir "$work/corrupt"
cp "$file" "$corrupt"
size=$(stat -c %s "$corrupt")
offset=$((size / 2))
byte=$(od -An -tu1 -j "$offset" -N1 "$corrupt" | tr -d ' ')
# shellcheck disable=SC2059
printf "$(printf '\\%03o' $((byte ^ 0xff)))" | dd of="$corrupt" bs=1 seek="$offset" conv=notrunc status=none
out=$("$foreman" events "$corrupt" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "events on a corrupt file exited $rc, want 2: $out"
[[ $out == *"$corrupt: corrupted record at offset "* ]] || fail "corrupt file error does not name it: $out"

# -- a damaged record in the middle: what precedes it, then the error ------------
# (TF's summary_iterator and TensorBoard's loader yield every record before
# the damage.) Record 3 of 6 (step 2's loss) gets a flipped data byte.
mid="$work/mid/events.out.tfevents.1700000000.mid"
mkdir "$work/mid"
cp "$file" "$mid"
offset3=$(/usr/bin/python3 - "$mid" <<'PY'
import struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
offset = 0
for _ in range(3):  # skip records 0-2: 8-byte length, 4-byte CRC, data, 4-byte CRC
    (length,) = struct.unpack_from("<Q", data, offset)
    offset += 12 + length + 4
data[offset + 12] ^= 0xFF  # the first data byte of record 3
open(path, "wb").write(data)
print(offset)
PY
) || fail "could not damage $mid"
out=$("$foreman" events "$mid" 2>"$work/mid.err"); rc=$?
err=$(<"$work/mid.err")
[[ $rc -eq 2 ]] || fail "events on a file damaged in the middle exited $rc, want 2: $err"
[[ $out == "$(head -n 5 <<<"$expected_text")" ]] || fail "events on a file damaged in the middle printed:
$out
expected the 5 lines before the damage"
[[ $err == "foreman events: $mid: corrupted record at offset $offset3: data checksum mismatch" ]] ||
  fail "damage error does not name the file and the record's offset $offset3: $err"

# -- runs: each directory with event files, sorted, "." for the log dir's own --
logs="$work/logs"
mkdir -p "$logs/train" "$logs/a/b" "$logs/no-events"
cp "$file" "$logs/"
cp "$file" "$logs/train/"
cp "$file" "$logs/a/b/"
loss='step 1  wall 1700000000.500  scalar  loss = 0.25
step 2  wall 1700000001.000  scalar  loss = 0.125'
out=$("$foreman" events --tag loss "$logs" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "events on a log dir with runs exited $rc: $out"
[[ $out == "# run .
$loss
# run a/b
$loss
# run train
$loss" ]] || fail "events on a log dir with runs printed:
$out"
rm "$logs"/events.out.tfevents.*
out=$("$foreman" events --tag loss --json "$logs" 2>&1); rc=$?
[[ $rc -eq 0 ]] || fail "events --json on runs exited $rc: $out"
[[ $(wc -l <<<"$out") -eq 4 && $(head -n 1 <<<"$out") == "{\"file\":\"$logs/a/b/${file##*/}\",\"run\":\"a/b\","* &&
   $(tail -n 1 <<<"$out") == "{\"file\":\"$logs/train/${file##*/}\",\"run\":\"train\","* ]] ||
  fail "events --json on runs (no files at the root) printed:
$out"

out=$("$foreman" events "$work/no-such-dir" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "events on a missing path exited $rc, want 2: $out"
[[ $out == *"$work/no-such-dir"* ]] || fail "missing path error does not name it: $out"

mkdir "$work/empty"
out=$("$foreman" events "$work/empty" 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "events on a directory without event files exited $rc, want 2: $out"
[[ $out == *"no event files in $work/empty"* ]] || fail "empty directory error: $out"

out=$("$foreman" events 2>&1); rc=$?
[[ $rc -eq 2 ]] || fail "events without a path exited $rc, want 2: $out"

# -- strings from the file stay on their line (issue 30 point 6) ----------------
# A tag that forges a line and clears the screen, a bidi override, a byte
# that is not UTF-8, a tab in a checkpoint path: escaped in text, exact in JSON.
"$write_sample_events" "$work/hostile" --hostile || fail "write_sample_events --hostile exited $?"
expected_hostile='step 0  wall 1700000000.000  file_version  brain.Event:2
step 1  wall 1700000000.000  scalar  loss\nstep 9  wall 0  scalar  loss = 0\x1b[2J = 0.5
step 1  wall 1700000000.000  text  note\u202e = "a\rb\xff"
step 1  wall 1700000000.000  session_log  CHECKPOINT  checkpoint_path /ckpt/x\tmodel.ckpt-1'
out=$("$foreman" events "$work/hostile" 2>&1); rc=$?
[[ $rc -eq 0 && $out == "$expected_hostile" ]] || fail "events on hostile strings exited $rc and printed:
$out
expected:
$expected_hostile"
if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f\x80-\xff]' <<<"$out"; then fail "a control or non-ASCII byte reached the terminal"; fi
out=$("$foreman" events --json "$work/hostile" 2>&1); rc=$?
[[ $rc -eq 0 && $out == *'"tag":"loss\nstep 9  wall 0  scalar  loss = 0\u001b[2J"'* &&
   $out == *$'"tag":"note\xe2\x80\xae"'* && $out == *'"checkpoint_path":"/ckpt/x\tmodel.ckpt-1"'* ]] ||
  fail "events --json on hostile strings exited $rc and printed: $out"

if ((failures > 0)); then echo "$failures failure(s)"; exit 1; fi
echo "events_cli: all checks passed"
