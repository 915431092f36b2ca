# Shared by the --ep CLI tests (sourced, issue 19): needs $bin, $tmp (with the tiny model in
# $tmp/tiny), fail() and, for serve, a `serve_pid` the caller's EXIT trap kills.

# streaming_rank FRONT RANK OUT ERR: the pid of the front's rank RANK once OUT (the front's
# stdout) holds some text; fails (showing ERR) when none comes.
streaming_rank() {
    local front=$1 rank=$2 out=$3 err=$4 pid=""
    for _ in $(seq 600); do
        pid=$(pgrep -P "$front" -f -- "--ep-rank $rank" || true)
        [[ -n $pid && $(wc -c <"$out") -gt 30 ]] && break
        sleep 0.05
    done
    [[ -n $pid ]] || { kill -9 "$front"; cat "$err" >&2; fail "no rank $rank / no tokens"; }
    echo "$pid"
}

# generate_kill_rank RANK EP: `generate --ep EP` of 100 tokens with rank RANK killed -9 once
# tokens stream: the front restarts the group with the EP - 1 healthy ranks, re-runs the
# request as a continuation and prints exactly one process's text; the failover counted.
generate_kill_rank() {
    local rank=$1 ep=$2 leader victim=""
    local args=(generate --model "$tmp/tiny" --threads 1 --kv-cache-mb 64 --prompt "The experts"
        --max-tokens 100)
    "$bin" "${args[@]}" >"$tmp/fo1.out" 2>/dev/null || fail "generate (100)"
    # (the binary itself in the background: $! is the front)
    "$bin" "${args[@]}" --ep "$ep" >"$tmp/fo.out" 2>"$tmp/fo.err" &
    leader=$!
    victim=$(streaming_rank "$leader" "$rank" "$tmp/fo.out" "$tmp/fo.err")
    kill -9 "$victim"
    wait "$leader" || { cat "$tmp/fo.err"; fail "the front failed after rank $rank was killed"; }
    grep -q -- "--ep failover: $((ep - 1)) of $ep ranks healthy" "$tmp/fo.err" ||
        { cat "$tmp/fo.err"; fail "no failover"; }
    grep -Eq "expert parallelism: $((ep - 1)) ranks, .*, 1 failovers" "$tmp/fo.err" ||
        { cat "$tmp/fo.err"; fail "failover not counted"; }
    grep -Eq "attention data parallelism: requests per rank .*, 1 re-run" "$tmp/fo.err" ||
        { cat "$tmp/fo.err"; fail "the request was not re-run"; }
    cmp -s "$tmp/fo1.out" "$tmp/fo.out" ||
        { diff "$tmp/fo1.out" "$tmp/fo.out" || true; fail "text differs after rank $rank was killed"; }
}

# serve_completions NAME ARGS...: `serve ARGS` answers three concurrent completions
# (MAX_TOKENS each, 12 by default; greedy and seeded); prints their texts; leaves
# $tmp/NAME.metrics (after them) and $tmp/NAME.ranks (the ranks it started); SIGTERM ends
# it, exit 0. KILL_RANK=R: rank R is killed -9 once the group has stepped a little (and
# the front is checked to map no weights while that rank does).
# serve_start NAME ARGS...: starts `serve ARGS` on the tiny model (stdout/stderr in
# $tmp/NAME.out/.err), sets serve_pid and port once it listens.
serve_start() {
    local name=$1
    shift
    port=""
    "$bin" serve --model "$tmp/tiny" --threads 1 --kv-cache-mb 64 --port 0 "$@" \
        >"$tmp/$name.out" 2>"$tmp/$name.err" &
    serve_pid=$!
    for _ in $(seq 600); do
        # (the background shell may not have made NAME.out yet: under load the first look
        # can come before its redirection, and a failing sed would end the test silently)
        port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/$name.out" 2>/dev/null || true)
        [[ -n $port ]] && break
        kill -0 "$serve_pid" 2>/dev/null || break
        sleep 0.05
    done
    [[ -n $port ]] || { cat "$tmp/$name.err"; fail "$name did not start"; }
}

serve_completions() {
    local name=$1 port="" victim
    shift
    serve_start "$name" "$@"
    pgrep -P "$serve_pid" -f -- "--ep-rank" | wc -l >"$tmp/$name.ranks" || true  # started ranks
    for i in 1 2 3; do
        curl -sS --max-time 300 "http://127.0.0.1:$port/v1/completions" \
            -H 'Content-Type: application/json' \
            -d "{\"model\":\"tiny\",\"prompt\":\"request $i\",\"max_tokens\":${MAX_TOKENS:-12},\"temperature\":$((i % 2)),\"seed\":$i}" \
            >"$tmp/$name.$i.json" &
    done
    if [[ -n ${KILL_RANK:-} ]]; then
        for _ in $(seq 600); do
            steps=$(curl -sS --max-time 5 "http://127.0.0.1:$port/metrics" |
                sed -n 's/^dsinfer_ep_steps_total \([0-9]*\)$/\1/p')
            [[ ${steps:-0} -ge 8 ]] && break
            sleep 0.05
        done
        victim=$(pgrep -P "$serve_pid" -f -- "--ep-rank $KILL_RANK")
        ! grep -q safetensors "/proc/$serve_pid/maps" || fail "$name: the front mapped the weights"
        grep -q safetensors "/proc/$victim/maps" || fail "$name: rank $KILL_RANK mapped no weights"
        kill -9 "$victim"
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

# serve_failover RANK EP: three concurrent requests of 40 tokens under `serve --ep EP`,
# rank RANK killed -9 while they run: every completion is one process's, /metrics shows the
# group of EP - 1 ranks, one failover and the re-runs (the restart replaces every rank's
# process, so every request is re-run as a continuation).
serve_failover() {
    local rank=$1 ep=$2
    MAX_TOKENS=40 serve_completions fo_one >"$tmp/fo_one.txt"
    MAX_TOKENS=40 KILL_RANK=$rank serve_completions fo_ep --ep "$ep" >"$tmp/fo_ep.txt"
    [[ $(grep -c . "$tmp/fo_one.txt") -eq 3 ]] || { cat "$tmp"/fo_one.*.json; fail "serve: no completions"; }
    cmp -s "$tmp/fo_one.txt" "$tmp/fo_ep.txt" ||
        { diff "$tmp/fo_one.txt" "$tmp/fo_ep.txt" || true; fail "serve: completions differ after rank $rank was killed"; }
    for m in 'dsinfer_ep_failovers_total 1' "dsinfer_ep_ranks $((ep - 1))"; do
        grep -qF "$m" "$tmp/fo_ep.metrics" || { cat "$tmp/fo_ep.metrics"; fail "serve failover /metrics: $m"; }
    done
    grep -Eq "^dsinfer_dp_reruns_total [1-9]" "$tmp/fo_ep.metrics" ||
        { cat "$tmp/fo_ep.metrics"; fail "serve failover: no request re-run"; }
}
