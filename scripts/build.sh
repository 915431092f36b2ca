#!/usr/bin/env bash
# build.sh [release|asan|fuzz] [--configure-only | TARGET...]: configure (once) and build
# into build/, build-asan/ or build-fuzz/ (clang, libFuzzer + ASan/UBSan instrumentation;
# only the fuzz targets). TARGETs (ninja targets or output paths) limit the build.
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-release}"
shift || true
targets=()
# Line tables only (-g1): file:line in backtraces, sanitizer reports and perf, at about
# two thirds of the compile time of full debug info (configure by hand with -g for gdb).
release_flags="-O2 -g1 -DNDEBUG"
case "$kind" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$release_flags"
        -DDSINFER_WERROR=ON) ;;
  # -Og: about half the compile time of -O1 under the sanitizers, nearly its speed;
  # Debug keeps DSI_DCHECK on.
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-Og -g1" -DDSINFER_WERROR=ON -DDSINFER_SANITIZE=ON
        -DDSINFER_BUILD_BENCH=OFF) ;;
  fuzz) dir=build-fuzz; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$release_flags"
        -DDSINFER_FUZZ=ON -DDSINFER_WERROR=ON
        -DDSINFER_BUILD_BENCH=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
        targets=(fuzz_http fuzz_safetensors fuzz_gguf fuzz_v4_load v4_fuzz_seed fuzz_transfer
          fuzz_swa_fetch fuzz_bootstrap) ;;
  *) echo "usage: build.sh [release|asan|fuzz]" >&2; exit 2 ;;
esac
if [[ ! -f "$dir/build.ninja" ]]; then
  cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
fi
if [[ "${1:-}" == --configure-only ]]; then exit 0; fi
targets+=("$@")
ninja -C "$dir" -j "$(nproc)" "${targets[@]}"
