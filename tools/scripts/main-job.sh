#!/usr/bin/env bash
# README's first command: installs what is missing, builds (release) and runs
# the main job, `foreman train` on Fashion-MNIST with its default settings.
#
#   tools/scripts/main-job.sh [foreman train flags...]
#
# Without flags each invocation trains a fresh run in runs/fashion-mnist-<time>;
# pass --checkpoint-dir DIR to resume (or extend, with a larger --max-steps)
# an earlier run. Exits with foreman train's exit code.
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/scripts/install-deps.sh
tools/scripts/build.sh release
args=("$@")
if [[ " ${args[*]-} " != *" --checkpoint-dir"* ]]; then
  args+=(--checkpoint-dir "runs/fashion-mnist-$(date +%Y%m%d-%H%M%S)")
fi
exec build-release/tools/foreman train "${args[@]}"
