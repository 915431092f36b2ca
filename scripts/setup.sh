#!/usr/bin/env bash
# Installs exactly what the build, tests and benchmarks need. Idempotent: a second
# run installs nothing. Run as root on Debian 12 (uses apt-get and npm).
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config clang
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libxxhash-dev
  libboost-dev libboost-system-dev
  libicu-dev
  libopenblas-dev libdnnl-dev
  liburing-dev libhiredis-dev libisal-dev redis-server
  libucx-dev   # transfer: the UCX transport (--kv-transport ucx, issue 18)
  libnuma-dev  # --ep ranks pinned to NUMA nodes (issue 19)
  etcd-server  # membership_test, the cluster drills (issue 18)
  iproute2     # netns_drill_test: ip netns, veth, bridge
  nftables     # netns_drill_test: real packet loss (no sch_netem in the kernels here)
  nodejs npm
  python3-matplotlib  # tools/plots/plot.py: every figure, ctest plots_test
  clang libclang-rt-14-dev
  chromium
)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    # nodejs/npm may come from outside Debian (e.g. NodeSource); accept any working binary.
    if [[ "$p" == nodejs ]] && command -v node >/dev/null; then continue; fi
    if [[ "$p" == npm ]] && command -v npm >/dev/null; then continue; fi
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || true
  apt-get install -y -qq "${missing[@]}"
fi

# npm test peers, each into its own project-local folder (never global).
for dir in tests/llamacpp tests/tokenizer tests/grammar tests/protocol tests/server tests/browser; do
  if [[ -f "$dir/package-lock.json" ]]; then
    stamp="$dir/node_modules/.dsinfer-lock-stamp"
    if [[ ! -f "$stamp" ]] || ! cmp -s "$dir/package-lock.json" "$stamp"; then
      echo "setup: npm ci in $dir"
      (cd "$dir" && npm ci --ignore-scripts --omit=optional --no-audit --no-fund --loglevel=error)
      cp "$dir/package-lock.json" "$stamp"
    fi
  fi
done
