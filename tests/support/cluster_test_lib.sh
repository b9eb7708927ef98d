# Shared by the multi-process cluster tests (tests/cluster_*_test.sh):
# sourced after `set -u` with NAME set to the test's name. Gives:
#   $tmp       a fresh temporary directory, removed at exit
#   pids       the processes the test started (append each one): at exit
#              each still running is killed with -9, with its children
#              (`foreman cluster local` runs each task in its own group)
#   fail MSG   counts a failure and prints it; failures_summary repeats
#              every one (the test's last lines: CI shows a run's end)
#   has REGEX TEXT
#   rc         the exit status wait_bounded saw
#   scaled N   N seconds (or ms) times the one timing scale, rounded up
#   steps_in FILE, free_ports N, free_port_run N
# and the waits below (wait_bounded, wait_for_line(s), wait_for_steps), each bounded (by its bound, scaled). Exits 1 when
# Fashion-MNIST is missing or $FOREMAN_TEST_TIME_SCALE is malformed.
py=/usr/bin/python3
failures=0
fail_msgs=()
fail() { echo "FAIL: $*"; failures=$((failures + 1)); fail_msgs+=("${*:0:400}"); }
failures_summary() {
  local m
  echo "$failures failure(s):"
  for m in "${fail_msgs[@]}"; do echo "  FAIL: $m"; done
}
has() { grep -Eq -- "$1" <<<"$2"; }
# The one timing scale of the suite (tests/support/test_util.hpp's
# TimeScale()): the build's factor (meson sets FOREMAN_TEST_BUILD_TIME_SCALE:
# 3 under the sanitizers) times $FOREMAN_TEST_TIME_SCALE, a number from 1 to
# 100 for a loaded machine (default 1). Tests multiply the bounds they check
# and the waits they allow by it, never the settings whose effect they check.
time_scale=$(awk -v b="${FOREMAN_TEST_BUILD_TIME_SCALE:-1}" -v u="${FOREMAN_TEST_TIME_SCALE:-1}" '
  BEGIN { if (u !~ /^[0-9]+(\.[0-9]+)?$/ || u < 1 || u > 100) exit 1; print b * u }') || {
  echo "FAIL: FOREMAN_TEST_TIME_SCALE must be a number from 1 to 100, not '${FOREMAN_TEST_TIME_SCALE}'"
  exit 1
}
scaled() { awk -v n="$1" -v s="$time_scale" 'BEGIN { v = n * s; r = int(v); if (r < v) r++; print r }'; }
mkdir -p "${TEST_TMPDIR:-/tmp}" || exit 1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/$NAME.XXXXXX") \
  || { echo "cannot create a temporary directory under ${TEST_TMPDIR:-/tmp}" >&2; exit 1; }
pids=()
# Kills process $1 (one of ours) and its children with -9.
kill_with_children() {
  local c
  kill -0 "$1" 2>/dev/null || return 0
  for c in $(pgrep -P "$1" 2>/dev/null); do kill -9 "$c" 2>/dev/null; done
  kill -9 "$1" 2>/dev/null
}
cleanup() {
  local p
  for p in "${pids[@]}"; do kill_with_children "$p"; done
  rm -rf "$tmp"
}
trap cleanup EXIT

if [[ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  echo "FAIL: Fashion-MNIST is missing: install Debian's dataset-fashion-mnist (tools/scripts/install-deps.sh)"
  exit 1
fi

# Waits (at most $2 s, scaled) for process $1, one of ours, to exit; its exit status
# in $rc (137 after a kill when it ran past the bound).
rc=0
wait_bounded() {
  local pid=$1 secs i
  secs=$(scaled "$2")
  for ((i = 0; i < secs * 20; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "process $pid still running after $secs s: killing it and its children"
    kill_with_children "$pid"
  fi
  wait "$pid" 2>/dev/null
  rc=$?
}

# Waits (at most $3 s, scaled) until file $2 has $4 lines matching $1, or process
# $5 exits.
wait_for_lines() {
  local pattern=$1 file=$2 secs n=$4 pid=$5 i c
  secs=$(scaled "$3")
  for ((i = 0; i < secs * 20; i++)); do
    c=$(grep -Ec -- "$pattern" "$file" 2>/dev/null)
    ((${c:-0} >= n)) && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
# Waits (at most $3 s, scaled) until file $2 matches $1, or process $4 exits.
wait_for_line() { wait_for_lines "$1" "$2" "$3" 1 "$4"; }

# The number of progress lines ("step N ...") in file $1 (0 if none).
steps_in() {
  local c
  c=$(grep -Ec '^step [0-9]+' "$1" 2>/dev/null)
  echo "${c:-0}"
}

# Waits (at most $3 s, scaled) until file $1 has more than $2 progress
# lines, or process $4 exits.
wait_for_steps() {
  local file=$1 count=$2 secs pid=$4 i
  secs=$(scaled "$3")
  for ((i = 0; i < secs * 20; i++)); do
    (($(steps_in "$file") > count)) && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# $1 free TCP ports on 127.0.0.1, bound together (so distinct), on one line.
free_ports() {
  "$py" -c '
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"
}

# The first of $1 consecutive free TCP ports on 127.0.0.1 (all bound
# together once, then released), for a rule like Slurm's base + rank; at
# most 50 tries.
free_port_run() {
  "$py" -c '
import random, socket, sys
n = int(sys.argv[1])
for _ in range(50):
    base = random.randrange(20000, 60000 - n)
    ss = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            ss.append(s)
            s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        for s in ss:
            s.close()
    print(base)
    sys.exit(0)
sys.exit(1)' "$1"
}
