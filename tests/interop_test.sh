#!/usr/bin/env bash
# Foreman's checkpoint and event files, read back by independent Python readers.
#
#   interop_test.sh <write_interop_samples> <tools/testing dir>
#
# 1. the Python tools check themselves: the committed fixtures under
#    tests/testdata/independent are what make_bundle_fixtures.py builds and read
#    back, TF's real checkpoints read as documented; the verifiers accept good
#    files and reject bad ones;
# 2. write_interop_samples writes a checkpoint (Saver) and an event file
#    (EventFileWriter) with expected.txt files beside them;
# 3. verify_checkpoint.py and verify_events.py check them.
# Runs on Debian's /usr/bin/python3 (python3-protobuf, python3-crc32c,
# python3-snappy: tools/scripts/install-deps.sh installs them).
set -euo pipefail

samples=$1
tools=$2
py=/usr/bin/python3
testdata="$tools/../../tests/testdata"

if ! "$py" -c 'import google.protobuf, crc32c, snappy' 2>/dev/null; then
  echo "interop_test: $py lacks python3-protobuf, python3-crc32c or python3-snappy" >&2
  echo "interop_test: run tools/scripts/install-deps.sh" >&2
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/foreman-interop.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "== 1. the Python tools check themselves"
"$py" -B "$tools/make_bundle_fixtures.py" --check-only \
      --tf-checkpoints "$testdata/tf-checkpoints" "$testdata/independent"
"$py" -B "$tools/selftest_verifiers.py"

echo "== 2. write_interop_samples $work"
"$samples" "$work"

echo "== 3. independent verification"
status=0
prefix="$work/ckpt/model.ckpt-7"
"$py" -B "$tools/verify_checkpoint.py" "$prefix" "$work/ckpt/expected.txt" || status=1

if ! grep -q '^model_checkpoint_path: "model.ckpt-7"$' "$work/ckpt/checkpoint"; then
  echo "interop_test: FAIL: $work/ckpt/checkpoint does not name model.ckpt-7 (relative) as the latest:" >&2
  cat "$work/ckpt/checkpoint" >&2 || true
  status=1
fi

shopt -s nullglob
events=("$work"/events/events.out.tfevents.*)
if [ "${#events[@]}" -ne 1 ]; then
  echo "interop_test: FAIL: expected one event file in $work/events, found ${#events[@]}" >&2
  ls -la "$work/events" >&2 || true
  status=1
else
  "$py" -B "$tools/verify_events.py" "${events[0]}" "$work/events/expected.txt" || status=1
fi

if [ "$status" -ne 0 ]; then
  echo "interop_test: FAILED" >&2
else
  echo "interop_test: OK"
fi
exit "$status"
