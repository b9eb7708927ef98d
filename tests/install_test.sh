#!/usr/bin/env bash
# `meson install` puts the public headers, libforeman and foreman.pc in place,
# and a program builds against them alone (no source tree, no build tree).
# Usage: install_test.sh BUILD_DIR HELLO_CPP [SANITIZE]
#   SANITIZE: meson's b_sanitize of that build ("none", "address,undefined"):
#   a program linking a sanitized libforeman must be built with the same.
set -euo pipefail
build_dir=$1
hello_cpp=$2
sanitize=${3:-none}
extra=()
[[ $sanitize == none ]] || extra=(-fsanitize="$sanitize")
stage=$(mktemp -d "${TMPDIR:-/tmp}/foreman-install.XXXXXX")
trap 'rm -rf "$stage"' EXIT

meson install -C "$build_dir" --no-rebuild --destdir "$stage" --quiet >/dev/null

pc=$(find "$stage" -name foreman.pc -print -quit)
[[ -n "$pc" ]] || { echo "FAIL: foreman.pc not installed"; exit 1; }
[[ -f $(dirname "$pc")/../../../include/foreman/status.hpp || -n $(find "$stage" -path '*include/foreman/status.hpp') ]] \
  || { echo "FAIL: public headers not installed"; exit 1; }
[[ -z $(find "$stage" -path '*include/foreman/*' -name '*.cpp') ]] || { echo "FAIL: sources installed as headers"; exit 1; }

# The .pc says prefix=<configured prefix>; relocate it to the staged copy
# (--define-variable would also rewrite the prefix of eigen3.pc and others).
export PKG_CONFIG_PATH=$(dirname "$pc")
sed -i "s|^prefix=|prefix=$stage|" "$pc"
flags=$(pkg-config --cflags --libs foreman)
[[ $flags != *"$(cd "$(dirname "$0")/.." && pwd)"* ]] || { echo "FAIL: pkg-config points into the source tree: $flags"; exit 1; }

cp "$hello_cpp" "$stage/hello.cpp"
(cd "$stage" && c++ -std=c++17 "${extra[@]}" hello.cpp -o hello $flags)
libdir=$(pkg-config --variable=libdir foreman)
out=$(LD_LIBRARY_PATH="$libdir" "$stage/hello")
[[ $out == "hello from foreman "* ]] || { echo "FAIL: installed program printed '$out'"; exit 1; }
echo "install: $out"
