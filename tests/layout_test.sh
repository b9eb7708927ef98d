#!/usr/bin/env bash
# The architecture as the tree shows it:
#   - src/ is grouped into its rooms;
#   - CAF is included only by actors/ (the runtime that owns the actor system),
#     the public actor API header, its example, and the tests of actors and of
#     the actor API (which build their own systems, as users do);
#   - Foreman constructs a caf::actor_system in exactly one place,
#     actors/actor_system.cpp (tests and the example build users' systems);
#   - tools/ is a face: the CLI, benchmarks and examples include only
#     installed headers, and no .cpp there exceeds 400 lines.
# Usage: layout_test.sh <source root>
set -uo pipefail
root=${1:?usage: layout_test.sh <source root>}
cd "$root" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

rooms=(cluster compute data fault formats nn platform runtime train)
actual=$(find src -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort | tr '\n' ' ')
[[ $actual == "${rooms[*]} " ]] || fail "src/ holds '$actual', expected '${rooms[*]} '"

allowed_caf='^(actors/|include/foreman/actor_api\.hpp$|tools/examples/actor_training\.cpp$|tests/(actor_api|actors|cluster_net|cluster_server|input_pipeline|ps_shard)_test\.cpp$|tests/doc_examples_main\.cpp$|tests/support/doc_example_fixture\.hpp$|tests/support/typed_job_misuse\.cpp$)'
while IFS= read -r file; do
  [[ $file =~ $allowed_caf ]] || fail "$file includes CAF (only actors/ and the actor API may)"
done < <(grep -rlE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]caf/' src actors include tools tests --include='*.cpp' \
           --include='*.hpp' --include='*.h' --include='*.cu' 2>/dev/null | sort)

# Foreman's own code (not tests or the example, which stand for users; nor
# a header comment's example, which is a user's code, compiled by
# doc_examples: the include check above looks at lines that start with
# #include only, this one skips comment lines).
while IFS= read -r hit; do
  file=${hit%%:*}
  text=${hit#*:*:}
  [[ $text =~ ^[[:space:]]*// ]] && continue
  [[ $file == actors/actor_system.cpp ]] || fail "a caf::actor_system is constructed outside actors/actor_system.cpp: $hit"
done < <(grep -rnE 'caf::actor_system[[:space:]]*>[[:space:]]*\(|caf::actor_system[[:space:]]+[a-z_]+[[:space:]]*[({]' \
           src actors include tools/foreman tools/bench --include='*.cpp' --include='*.hpp' 2>/dev/null)
n=$(grep -c 'make_unique<caf::actor_system>' actors/actor_system.cpp)
[[ $n == 1 ]] || fail "actors/actor_system.cpp constructs $n actor systems, expected 1"

# tools/ is a face (issue 26): the CLI, the benchmarks and the examples are
# built the way a user builds against the installed library. Their quoted
# includes name an installed header (foreman/*.hpp), a header beside them,
# or a third-party library; their meson files add no include path into src/.
third_party='^(absl|CLI|nlohmann|benchmark|Eigen|unsupported|doctest|google)/'
while IFS= read -r hit; do
  file=${hit%%:*}
  header=$(sed -E 's/.*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"${hit#*:}")
  if [[ $header == foreman/* ]]; then
    [[ -e include/$header || -e include/$header.in ]] ||
      fail "$file includes \"$header\", which is not an installed header (include/$header)"
  elif [[ $header =~ $third_party ]]; then
    :
  elif [[ $header != */* && -e $(dirname "$file")/$header ]]; then
    :
  else
    fail "$file includes \"$header\": tools/ may include only installed headers (foreman/*.hpp), its own, or third-party ones"
  fi
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' tools/foreman tools/bench tools/examples \
           --include='*.cpp' --include='*.hpp' --include='*.h' 2>/dev/null)
# No way around it with a relative path, in either include form.
while IFS= read -r hit; do
  fail "tools/ includes through a relative path ($hit): only installed headers, by name"
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"][^>"]*\.\./' tools/foreman tools/bench tools/examples \
           --include='*.cpp' --include='*.hpp' --include='*.h' 2>/dev/null)
while IFS= read -r hit; do
  fail "tools/ reaches past the installed headers ($hit): it builds as a user does, with foreman_dep"
done < <(grep -rnE 'include_directories|foreman_internal_dep' tools --include=meson.build 2>/dev/null)

# No .cpp under tools/ over 400 lines: product logic lives in the library.
while IFS= read -r file; do
  n=$(wc -l <"$file")
  ((n <= 400)) || fail "$file has $n lines (tools/ files stay under 400: move the logic into a src/ room)"
done < <(find tools -name '*.cpp' | sort)

# No test knobs in the product: tests use Env/Clock seams, fault plans or a
# test build of the program (tests/support/foreman_testing_main.cpp).
while IFS= read -r hit; do
  fail "product code reads a test knob: $hit"
done < <(grep -rnE 'getenv\("FOREMAN_[A-Z_]*TEST' src actors tools --include='*.cpp' --include='*.hpp' 2>/dev/null)

# The runtime does not depend on the MLP library: StepContext's gradient seam
# takes foreman/optimizer.hpp's types, which src/nn implements.
while IFS= read -r hit; do
  fail "src/runtime includes the MLP library: $hit"
done < <(grep -rnE '#[[:space:]]*include[[:space:]]*"(nn/|foreman/nn\.hpp)' src/runtime 2>/dev/null)

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "layout_test: OK"
