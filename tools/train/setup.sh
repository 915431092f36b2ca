#!/usr/bin/env bash
# Packages the default model's trainer needs (not the product, tests or CI, which only
# expand the committed pack): Debian's PyTorch 1.13 and numpy.
set -euo pipefail
pkgs=(python3-torch python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || true
  apt-get install -y -qq "${missing[@]}"
fi
/usr/bin/python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"
