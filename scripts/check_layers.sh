#!/usr/bin/env bash
# Fails when a module includes a module above it (../shared/ARCHITECTURE.md, "Layers:
# dependencies point down only"). Each line of LAYERS is one layer, lowest first; a
# module may include its own layer's modules and any lower layer's, never a higher one.
# Tests beside the code (*_test.cc, test_*.h, *test_util.h) may reach up: they are not
# part of the library. Usage: check_layers.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
LAYERS=(
  "base"
  "net"
  "transfer"
  "workload"
  "tensor"
  "comm"
  "kernels"
  "tokenizer"
  "model modelpack"
  "sampling"
  "grammar"
  "spec"
  "kvstore"
  "kv"
  "engine"
  "protocol"
  "serving"
  "cluster membership"
  "sim"
  "server"
  "router"
  "loadgen"
)
declare -A rank
for i in "${!LAYERS[@]}"; do
  for m in ${LAYERS[$i]}; do rank[$m]=$i; done
done
status=0
for dir in src/*/; do
  mod="$(basename "$dir")"
  if [[ -z "${rank[$mod]+x}" ]]; then
    echo "check_layers: src/$mod is not in the layer list (scripts/check_layers.sh)" >&2
    status=1
    continue
  fi
  while IFS=: read -r file line inc; do
    case "$file" in *_test.cc | *test_util.h | */test_*.h | *_benchmark.cc) continue ;; esac
    dep="${inc%%/*}"
    [[ -z "${rank[$dep]+x}" ]] && continue
    if (( rank[$dep] > rank[$mod] )); then
      echo "$file:$line: $mod includes $inc (layer ${LAYERS[${rank[$dep]}]} is above $mod)" >&2
      status=1
    fi
  done < <(grep -rnoE '^#include "[a-z_]+/[^"]+"' "$dir" | sed -E 's/#include "([^"]+)"/\1/')
done
if (( status == 0 )); then echo "check_layers: every include points down"; fi
exit $status
