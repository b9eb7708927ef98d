#!/usr/bin/env bash
# README's second command: installs what is missing, then builds and runs the
# whole test suite three times, as CI does:
#   1. release build (warnings are errors)
#   2. ASan + UBSan build (warnings are errors, any report fails the test)
#   3. ThreadSanitizer build (any report fails the test; only Debian's
#      uninstrumented libcaf_core is suppressed, tools/sanitizers/tsan.supp)
#   4. a smoke run of each fuzz target, about 60 CPU-seconds each (tools/scripts/fuzz.sh)
# Ends with one line "N passed, N failed, N skipped" counted from meson's test
# logs of both builds (a build that fails counts as one failed test).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

tools/scripts/install-deps.sh || exit 1

supp=$root/tools/sanitizers
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:suppressions=$supp/asan.supp"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1:suppressions=$supp/tsan.supp"

results=()
for kind in release asan tsan; do
  dir=build-$kind
  rm -f "$dir/meson-logs/testlog.json"
  echo "=== $kind: build"
  if ! tools/scripts/build.sh "$kind"; then
    echo "=== $kind: BUILD FAILED"
    results+=("$kind:build-failed")
    continue
  fi
  echo "=== $kind: test"
  meson test -C "$dir" --print-errorlogs --num-processes 2
  results+=("$kind:$dir/meson-logs/testlog.json")
done

# 3. a smoke run of each libFuzzer target, about 60 CPU-seconds each (clang, ASan+UBSan)
echo "=== fuzz: about 60 CPU-seconds per target"
if tools/scripts/fuzz.sh 60; then :; fi
results+=("fuzz:build-fuzz/fuzz-work/fuzzlog.json")

/usr/bin/python3 tools/scripts/summarize_tests.py "${results[@]}"
