#!/usr/bin/env bash
# The main job: set up, build, create the embedded default model (once) and run
# dsinfer on it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
if [[ ! -f models/tiny/config.json ]]; then
  build/apps/dsinfer/dsinfer make-model --preset tiny --out models/tiny
fi
exec build/apps/dsinfer/dsinfer generate --model models/tiny --prompt "${1:-The capital of France is}" --max-tokens 32
