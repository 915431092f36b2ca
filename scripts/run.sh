#!/usr/bin/env bash
# The main job: set up, build, and run the dsinfer API server on the embedded default
# model (a synthetic DeepSeek-style checkpoint with the real DeepSeek V3 tokenizer,
# created on first run under ~/.cache/dsinfer and reused). Extra arguments go to
# `dsinfer serve` (e.g. --port 8000 --model DIR|FILE.gguf). The server prints its
# address and an example request; Ctrl-C (SIGTERM) drains and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
exec build/apps/dsinfer/dsinfer serve "$@"
