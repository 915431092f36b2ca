#!/usr/bin/env bash
# Runs every test: set-up, release build + tests (including the llama.cpp
# cross-check), then the AddressSanitizer/UBSan build + tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
ctest --test-dir build --output-on-failure -j "$(nproc)"
scripts/build.sh asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -LE no_asan
echo "all tests passed"
