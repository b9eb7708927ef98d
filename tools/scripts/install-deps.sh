#!/usr/bin/env bash
# Installs the Debian 12 packages Foreman needs to build, test and run its main
# job. Idempotent: asks apt-get only for what is missing. Runs as root, or via
# sudo otherwise.
#
# Usage: tools/scripts/install-deps.sh [--with-fuzz]
#   --with-fuzz   also install clang + libclang-rt-14-dev for the libFuzzer targets
set -euo pipefail

packages=(
  # build
  meson ninja-build pkg-config g++
  # libraries
  libcaf-dev libprotobuf-dev protobuf-compiler libeigen3-dev doctest-dev
  libabsl-dev libspdlog-dev zlib1g-dev libleveldb-dev libsnappy-dev
  libcli11-dev libbenchmark-dev nlohmann-json3-dev libssl-dev
  # the openssl CLI: tools/scripts/gen-tls-certs.sh (test certificates)
  openssl
  # data for the main job
  dataset-fashion-mnist
  # independent readers used by tests, on Debian's /usr/bin/python3
  python3 python3-protobuf python3-crc32c python3-snappy
)
if [[ "${1:-}" == "--with-fuzz" ]]; then
  packages+=(clang libclang-rt-14-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    echo "install-deps: not root and no sudo; install these by hand: ${missing[*]}" >&2
    exit 1
  fi
  sudo_cmd=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
