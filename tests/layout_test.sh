#!/usr/bin/env bash
# The architecture as the tree shows it:
#   - src/ is grouped into its rooms;
#   - CAF is included only by actors/ (the runtime that owns the actor system),
#     the public actor API header, its example, and the tests of actors and of
#     the actor API (which build their own systems, as users do);
#   - Foreman constructs a caf::actor_system in exactly one place,
#     actors/actor_system.cpp (tests and the example build users' systems).
# Usage: layout_test.sh <source root>
set -uo pipefail
root=${1:?usage: layout_test.sh <source root>}
cd "$root" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

rooms=(cluster compute data fault formats nn platform runtime train)
actual=$(find src -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort | tr '\n' ' ')
[[ $actual == "${rooms[*]} " ]] || fail "src/ holds '$actual', expected '${rooms[*]} '"

allowed_caf='^(actors/|include/foreman/actor_api\.hpp$|tools/examples/actor_training\.cpp$|tests/(actor_api|actors|cluster_net|cluster_server|input_pipeline|ps_shard)_test\.cpp$|tests/doc_examples_main\.cpp$|tests/support/doc_example_fixture\.hpp$)'
while IFS= read -r file; do
  [[ $file =~ $allowed_caf ]] || fail "$file includes CAF (only actors/ and the actor API may)"
done < <(grep -rlE '#[[:space:]]*include[[:space:]]*[<"]caf/' src actors include tools tests --include='*.cpp' \
           --include='*.hpp' --include='*.h' --include='*.cu' 2>/dev/null | sort)

# Foreman's own code (not tests or the example, which stand for users).
while IFS= read -r hit; do
  file=${hit%%:*}
  [[ $file == actors/actor_system.cpp ]] || fail "a caf::actor_system is constructed outside actors/actor_system.cpp: $hit"
done < <(grep -rnE 'caf::actor_system[[:space:]]*>[[:space:]]*\(|caf::actor_system[[:space:]]+[a-z_]+[[:space:]]*[({]' \
           src actors include tools/foreman tools/bench --include='*.cpp' --include='*.hpp' 2>/dev/null)
n=$(grep -c 'make_unique<caf::actor_system>' actors/actor_system.cpp)
[[ $n == 1 ]] || fail "actors/actor_system.cpp constructs $n actor systems, expected 1"

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "layout_test: OK"
