#!/usr/bin/env bash
# thread_safety_check.sh [CLANGXX]: Clang's thread-safety analysis (STYLE 7) over every
# source whose locks carry DSI_GUARDED_BY (base/mutex.h): clang++ -fsyntax-only
# -Wthread-safety -Werror, no code generated (seconds; registered as the ctest
# `thread_safety_check`, so CI runs it with the other tests whatever the main compiler).
# A new annotated file goes in the list below.
set -euo pipefail
cd "$(dirname "$0")/.."
clangxx="${1:-clang++}"
if ! command -v "$clangxx" >/dev/null; then
  echo "thread_safety_check: $clangxx not found (scripts/setup.sh installs clang)" >&2
  exit 1
fi
sources=(
  src/engine/worker.cc src/engine/engine.cc
  src/kv/paged_kv_cache.cc src/kv/swa_pool.cc src/kv/tiered_cache.cc
  src/kvstore/async_store.cc src/kvstore/fetch_service.cc src/kvstore/file_store.cc
  src/kvstore/gc_worker.cc src/kvstore/redis_store.cc
  src/server/engine_service.cc src/server/metrics.cc
  src/transfer/transfer_state.cc
  src/membership/etcd_registry.cc src/membership/file_registry.cc src/router/remote_service.cc
  src/serving/kv_handoff.cc src/server/handoff_service.cc
  src/router/swa_directory_service.cc src/serving/swa_fetch.cc src/server/swa_pull_service.cc
  src/model/expert_parallel.cc apps/dsinfer/ep_launch.cc
)
status=0
for f in "${sources[@]}"; do
  if ! "$clangxx" -std=c++20 -fsyntax-only -Isrc -Wthread-safety \
      -Werror=thread-safety -Wno-unknown-warning-option "$f"; then
    echo "thread_safety_check: $f fails the analysis" >&2
    status=1
  fi
done
exit "$status"
