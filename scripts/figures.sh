#!/usr/bin/env bash
# Redraws every figure in docs/ and bench/figures/ with tools/plots/plot.py (matplotlib,
# Debian's python3-matplotlib) from the data committed beside it:
#   docs/figures/NAME.json           -> NAME.svg  (bench/sim_figures; default_model_loss
#                                                  from tools/train/publish.sh)
#   bench/figures/serve_sweep_*.json -> .svg      (`dsinfer bench serve --out-json`)
#
#   scripts/figures.sh            redraw from the committed data (seconds)
#   scripts/figures.sh --measure  first rerun build/bench/sim_figures to refresh the
#                                 simulator's data (minutes; build it with
#                                 scripts/build.sh release sim_figures)
# The bench serve reports need a running server: bench/serve_figures.sh measures them.
# The same data gives the same bytes, so a redraw without new data changes no file.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == --measure ]]; then
  for group in lb ops hit eplb; do  # the groups that write figure data
    build/bench/sim_figures docs/figures "$group"  # prints the tables of bench/RESULTS.md
  done
fi
shopt -s nullglob
for data in docs/figures/*.json bench/figures/serve_sweep_*.json; do
  /usr/bin/python3 tools/plots/plot.py "$data" "${data%.json}.svg"
  echo "figures: ${data%.json}.svg"
done
