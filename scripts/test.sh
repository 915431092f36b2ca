#!/usr/bin/env bash
# Runs every test: set-up, release build + tests (including the llama.cpp
# cross-check and the node-driven end-to-end tests), then the AddressSanitizer/UBSan
# build + its tests. Under the sanitizers we skip tests whose subject is the
# JavaScript side of a comparison or that are too slow there (labels node, slow,
# no_asan); the C++ code they drive is exercised by the other tests. Last, the
# libFuzzer targets run for a bounded time each (docs/fuzzing.md).
# A test that skips (GTEST_SKIP: its binary exits 77, ctest prints "Skipped") or is
# disabled fails the run: ctest itself counts both as passes.
set -euo pipefail
cd "$(dirname "$0")/.."

# run_ctest BUILD_DIR [ctest args...]: ctest, then fail if any selected test did not run.
run_ctest() {
  local dir="$1"
  shift
  local junit="$PWD/$dir/ctest-junit.xml"
  rm -f "$junit"
  ctest --test-dir "$dir" --output-on-failure --output-junit "$junit" "$@"
  local not_run
  not_run=$(grep -oE '<testcase name="[^"]*"[^>]*status="(notrun|disabled)"' "$junit" |
            sed -E 's/<testcase name="([^"]*)".*status="([a-z]*)"/\1 (\2)/' || true)
  if [[ -n "$not_run" ]]; then
    echo "FAILED: tests skipped or disabled in $dir (a skip counts as a failure in CI):" >&2
    echo "$not_run" >&2
    return 1
  fi
}

scripts/setup.sh
scripts/build.sh release
run_ctest build -j "$(nproc)"
scripts/build.sh asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  run_ctest build-asan -j "$(nproc)" -LE "no_asan|node|slow"
# Short bounded libFuzzer runs (label fuzz; clang build of the fuzz targets only).
scripts/build.sh fuzz
run_ctest build-fuzz -L fuzz
echo "all tests passed"
