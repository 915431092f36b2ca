#!/usr/bin/env bash
# build.sh [release|asan|fuzz]: configure (once) and build into build/, build-asan/ or
# build-fuzz/ (clang, libFuzzer + ASan/UBSan instrumentation; only the fuzz targets).
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-release}"
targets=()
case "$kind" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSINFER_WERROR=ON) ;;
  # -O1 keeps sanitised tests fast; Debug keeps DSI_DCHECK on.
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" -DDSINFER_WERROR=ON -DDSINFER_SANITIZE=ON
        -DDSINFER_BUILD_BENCH=OFF) ;;
  fuzz) dir=build-fuzz; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSINFER_FUZZ=ON -DDSINFER_WERROR=ON
        -DDSINFER_BUILD_BENCH=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
        targets=(fuzz_http fuzz_safetensors fuzz_gguf) ;;
  *) echo "usage: build.sh [release|asan|fuzz]" >&2; exit 2 ;;
esac
if [[ ! -f "$dir/build.ninja" ]]; then
  cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
fi
ninja -C "$dir" -j "$(nproc)" "${targets[@]}"
