#!/usr/bin/env bash
# README's first command: installs what is missing, builds, runs the main job.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/scripts/install-deps.sh
tools/scripts/build.sh release
# The main job (`foreman train` on Fashion-MNIST) lands with its issue; until
# then this shows the CLI that carries it.
build-release/tools/foreman --version
build-release/tools/foreman --help
