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
# The sanitizer phase builds only what its tests run: each selected test's binaries (the
# test program, the dsinfer CLI a script test drives); release built and tested the rest.
# ctest -N names the selected tests; their commands come from the CTestTestfile.cmake
# files (ctest omits the command of a test whose program is not built yet).
asan_select=(-LE "no_asan|node|slow")
scripts/build.sh asan --configure-only
mapfile -t asan_targets < <(
  ctest --test-dir build-asan -N "${asan_select[@]}" --show-only=json-v1 |
    node -e '
      const fs = require("fs"), path = require("path");
      const root = fs.realpathSync(process.argv[1]);
      const dirs = [path.resolve(process.argv[1]), root];
      const selected = new Set(JSON.parse(fs.readFileSync(0, "utf8")).tests.map(t => t.name));
      const out = new Set();
      const walk = (d) => {
        for (const e of fs.readdirSync(d, {withFileTypes: true})) {
          const p = path.join(d, e.name);
          if (e.isDirectory()) walk(p);
          else if (e.name === "CTestTestfile.cmake") {
            const text = fs.readFileSync(p, "utf8");
            for (const m of text.matchAll(/^add_test\(\[=\[(.+?)\]=\] (.*)\)$/gm)) {
              if (!selected.has(m[1])) continue;
              for (const a of m[2].matchAll(/"([^"]*)"/g))
                for (const b of dirs)
                  if (a[1].startsWith(b + "/")) out.add(a[1].slice(b.length + 1));
            }
          }
        }
      };
      walk(root);
      console.log([...out].join("\n"));' build-asan)
if ((${#asan_targets[@]} < 10)); then
  echo "FAILED: found only ${#asan_targets[@]} sanitizer test binaries to build" >&2
  exit 1
fi
scripts/build.sh asan "${asan_targets[@]}"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  run_ctest build-asan -j "$(nproc)" "${asan_select[@]}"
# Short bounded libFuzzer runs (label fuzz; clang build of the fuzz targets only).
scripts/build.sh fuzz
run_ctest build-fuzz -L fuzz -j "$(nproc)"
echo "all tests passed"
