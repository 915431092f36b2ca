#!/usr/bin/env bash
# Runs every test: set-up, release build + tests (including the llama.cpp
# cross-check and the node-driven end-to-end tests), then the AddressSanitizer/UBSan
# build + its tests. Under the sanitizers we skip tests whose subject is the
# JavaScript side of a comparison or that are too slow there (labels node, slow,
# no_asan); the C++ code they drive is exercised by the other tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
ctest --test-dir build --output-on-failure -j "$(nproc)"
scripts/build.sh asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -LE "no_asan|node|slow"
echo "all tests passed"
