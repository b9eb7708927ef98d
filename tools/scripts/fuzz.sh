#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan + coverage, CRC checks
# off) and runs each for a bounded time from a seed corpus of valid files.
# Prints, per target, the runs, the coverage reached and the corpus size, and
# fails if a target crashed, hung (-timeout per input) or leaked.
#
# The targets run side by side, each for SECONDS x targets / cores of wall
# time when there are more targets than cores (3 targets on 2 cores: 90 s
# each), so each still gets about SECONDS of CPU time while no core idles.
#
# Usage: tools/scripts/fuzz.sh [CPU_SECONDS_PER_TARGET]   (default 60)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
dir=build-fuzz

tools/scripts/install-deps.sh --with-fuzz >/dev/null
if [[ ! -f $dir/build.ninja ]]; then
  CC=clang CXX=clang++ meson setup "$dir" -Dfuzz=true -Dtests=false -Dcuda=disabled \
    -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
fi
ninja -C "$dir" tests/fuzz/record_fuzzer tests/fuzz/checkpoint_fuzzer tests/fuzz/idx_fuzzer tests/fuzz/make_corpus >/dev/null

work=$dir/fuzz-work
rm -rf "$work/seeds"
mkdir -p "$work/seeds" "$work/corpus/record" "$work/corpus/checkpoint" "$work/corpus/idx" "$work/artifacts"
"$dir/tests/fuzz/make_corpus" "$work/seeds" tests/testdata

# One JSON line per target, in meson's testlog format, for summarize_tests.py.
targets=(record checkpoint idx)
cores=$(nproc)
wall=$secs
(( ${#targets[@]} > cores )) && wall=$(( (secs * ${#targets[@]} + cores - 1) / cores ))
pids=()
for target in "${targets[@]}"; do
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$dir/tests/fuzz/${target}_fuzzer" "$work/corpus/$target" "$work/seeds/$target" \
    -max_total_time="$wall" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/$target-" >"$work/$target.log" 2>&1 &
  pids+=($!)
done
results=$work/fuzzlog.json
: >"$results"
status=0
for i in "${!targets[@]}"; do
  target=${targets[$i]}
  log=$work/$target.log
  set +e
  wait "${pids[$i]}"
  rc=$?
  set -e
  done_line=$(grep -E '^#[0-9]+.*DONE' "$log" | tail -1 || true)
  [[ -n $done_line ]] || done_line=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  if [[ $rc -eq 0 ]]; then
    echo "fuzz $target: ok after ${wall}s (${#targets[@]} targets on $cores cores): $done_line"
    echo "{\"name\": \"fuzz_$target\", \"result\": \"OK\"}" >>"$results"
  else
    echo "{\"name\": \"fuzz_$target\", \"result\": \"FAIL\"}" >>"$results"
    echo "fuzz $target: FAILED (exit $rc); see $log and $work/artifacts/"
    grep -E 'ERROR|SUMMARY|runtime error|deadly signal|timeout' "$log" | head -5 || true
    status=1
  fi
done
exit $status
