#!/usr/bin/env python3
"""Counts meson test results across builds and prints the closing line.

Usage: summarize_tests.py KIND:TESTLOG_JSON|KIND:build-failed ...
Prints the last lines of each failed test's output (CI keeps only the end of
the run's output: this is where a failure's cause must be), a table of
failures, then exactly one last line:
    N passed, N failed, N skipped
and exits 1 when anything failed (or no test ran at all), 0 otherwise.
"""
import json
import sys

TAIL_LINES = 40

passed = failed = skipped = 0
failures = []
tails = []
for arg in sys.argv[1:]:
    kind, _, path = arg.partition(":")
    if path == "build-failed":
        failed += 1
        failures.append(f"{kind}: build failed")
        continue
    try:
        with open(path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
    except OSError as e:
        failed += 1
        failures.append(f"{kind}: no test log ({e})")
        continue
    for t in lines:
        result = t.get("result")
        if result in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif result == "SKIP":
            skipped += 1
        else:
            failed += 1
            failures.append(f"{kind}: {t.get('name')} {result}")
            out = ((t.get("stdout") or "") + (t.get("stderr") or "")).splitlines()
            tails.append((f"{kind}: {t.get('name')}", out[-TAIL_LINES:]))

for name, tail in tails:
    print(f"--- the last {len(tail)} lines of {name}:")
    for line in tail:
        print("    " + line[:300])
for f in failures:
    print("FAILED", f)
if passed + failed == 0:
    failures.append("no test ran")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
