#!/usr/bin/env bash
# Issue 6 figures: `dsinfer bench serve` against `dsinfer serve` on the `small` preset.
#  1. concurrency sweep 1,16,64,256 (random dataset, streaming chat);
#  2. multi-turn dataset (shared system prompt + history) with the prefix cache on, then off.
# usage: bench/serve_figures.sh DSINFER_BINARY SMALL_MODEL_DIR OUT_DIR
# Writes OUT_DIR/{sweep,multiturn_true,multiturn_false}.json, the servers' logs and
# OUT_DIR/sweep.svg (tools/plots/plot.py; needs python3-matplotlib).
set -euo pipefail
bin=$1 model=$2 out=$3
port=${PORT:-18180}
mkdir -p "$out"
base=http://127.0.0.1:$port

start_server() {  # $1: log name, rest: extra flags
    local log=$1; shift
    "$bin" serve --model "$model" --model-id small --port "$port" --threads 2 \
        --max-concurrent 1024 "$@" >"$out/$log.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 600); do
        grep -q "listening on" "$out/$log.log" 2>/dev/null && return 0
        sleep 0.5
    done
    echo "server did not start" >&2; return 1
}
stop_server() { kill -TERM "$server_pid"; wait "$server_pid" || true; }

start_server serve_sweep
"$bin" bench serve --base-url "$base" --model small --dataset random \
    --input-len 16 --output-len 16 --num-prompts 16 --prompts-per-concurrency 1 \
    --concurrency 1,16,64,256 --label "dsinfer serve, small preset" \
    --out-json "$out/sweep.json"
stop_server
/usr/bin/python3 "$(dirname "$0")/../tools/plots/plot.py" "$out/sweep.json" "$out/sweep.svg"

for pc in true false; do
    start_server "serve_multiturn_$pc" --prefix-cache "$pc"
    "$bin" bench serve --base-url "$base" --model small --dataset multi-turn \
        --conversations 4 --turns 3 --system-prefix-len 256 --input-len 24 --output-len 12 \
        --concurrency 4 --label "multi-turn, prefix cache $pc" \
        --out-json "$out/multiturn_$pc.json"
    stop_server
done
