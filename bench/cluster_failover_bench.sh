#!/usr/bin/env bash
# Time from an engine's death to the resumed stream's next token (issue 18 figure), vs
# the stream's ordinary gap between tokens measured in the same run.
#   bench/cluster_failover_bench.sh [BUILD_DIR] [KILLS]
# etcd + two engines (`serve --role both`, default model, 1 thread each) + router on
# loopback. Each round streams a seeded request through the router, SIGKILLs the engine
# serving it after 10 chunks (tests/cluster/stream_client.py), checks the content is the
# reference, records the gap from the kill to the next chunk, and restarts the killed
# engine (same id, new incarnation). Prints p50 / p90 / max of both. Run it under
# `flock /work/.bench.lock` on a quiet machine.
set -euo pipefail
build="$(cd "${1:-build}" && pwd)"
kills="${2:-15}"
source "$(dirname "$0")/../tests/cluster/lib.sh"
membership="etcd://127.0.0.1:$ecp/bench/"
args=(serve --threads 1 --role both --membership "$membership" --lease-ttl-s 3)
declare -A port pid
for e in e1 e2; do
  start "$e" "${args[@]}" --node-id "$e"
  port[$e]=$last_port pid[$e]=$last_pid
done
start router router --membership "$membership" --lease-ttl-s 3
router_port=$last_port
client="$src/tests/cluster/stream_client.py"
body='{"model":"dsinfer-default","messages":[{"role":"user","content":"Tell me a story about a dog."}],
       "stream":true,"max_tokens":120,"temperature":0.8,"seed":11,"ignore_eos":true}'
ref="$(python3 "$client" "http://127.0.0.1:${port[e1]}/v1/chat/completions" "$body")"
results="$work/results.jsonl"
for i in $(seq "$kills"); do
  out="$(python3 "$client" "http://127.0.0.1:$router_port/v1/chat/completions" "$body" \
    --kill-after 10 --engines "${port[e1]}:${pid[e1]},${port[e2]}:${pid[e2]}")"
  echo "$out" >> "$results"
  killed="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["killed_pid"])' <<< "$out")"
  for e in e1 e2; do
    if [[ "${pid[$e]}" == "$killed" ]]; then
      wait "$killed" 2>/dev/null || true
      start "$e-$i" "${args[@]}" --node-id "$e"
      port[$e]=$last_port pid[$e]=$last_pid
    fi
  done
  sleep 1  # the router's watch sees the restarted engine
done
python3 - "$results" "$ref" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ref = json.loads(sys.argv[2])["content"]
assert all(r["content"] == ref and r["done"] for r in rows), "a stream differed"
resume = sorted(r["resume_s"] * 1000 for r in rows if r["resume_s"] is not None)
gaps = sorted(g * 1000 for r in rows for g in r["gaps"])
def pct(v, q): return v[min(len(v) - 1, int(q * len(v)))]
print(f"kills {len(resume)}; every stream == reference")
print(f"kill -> next token ms: p50 {pct(resume, .5):.1f}  p90 {pct(resume, .9):.1f}  max {resume[-1]:.1f}")
print(f"ordinary token gap ms (same streams, before the kill, {len(gaps)} gaps): "
      f"p50 {pct(gaps, .5):.1f}  p90 {pct(gaps, .9):.1f}  max {gaps[-1]:.1f}")
PY
