#!/usr/bin/env bash
# The simulator checked against the live cluster (issue 18 figure): `dsinfer sim`, given
# the live engines' calibrated costs, replays the same trace slice as a live
# disaggregated cluster and should predict its TTFT and TPOT percentiles within 20 %.
#   bench/sim_vs_live.sh [BUILD_DIR] [REQUESTS] [LOAD] [OFFSET]
# 1. `dsinfer calibrate --threads 1` of the default model: the prefill cost model (the
#    sim's prefill_cost, same coefficients) and the verify-cost curve (step time by
#    tokens in the step), from which the decode step model is fitted: base + per request
#    x batch + per KV token x context, the KV term being the prefill model's per_qc_ns
#    (one query token over its context) and the curve's context (256 a sequence) taken
#    out of the per-request term.
# 2. A slice of the vendored Azure 2023 conversation trace (REQUESTS from OFFSET),
#    prompts x 0.5 and outputs x 0.25 (4..64 tokens) so a 2-core machine can serve it,
#    written as Mooncake JSONL with one block id per 512 tokens, none shared (the Azure
#    traces carry no prefix information); the arrival scale T is the one at which the
#    simulator's busier stage runs at LOAD of its capacity (`dsinfer sim --load`).
# 3. Live: etcd, a prefill and a decode engine (`serve --role`, 1 thread each, the KV
#    hand-over on, the calibrated cost model for their chunking) and a router on
#    loopback; `dsinfer bench serve --dataset trace` replays the slice at scale T
#    (completions endpoint, ignore_eos, greedy).
# 4. The simulator on the same slice, scale and cluster description; both sides' TTFT
#    and TPOT p50 / p90 / p99 and the ratio sim / live.
# Run it under `flock /work/.bench.lock` on a quiet machine: the calibration and the
# live run must see the same machine. SVL_PIN=1 pins the prefill engine (and the
# calibration) to CPU 0 and the decode engine to CPU 1 (taskset), as the simulator
# gives each engine a device of its own; the router, etcd and the client float.
set -euo pipefail
build="$(cd "${1:-build}" && pwd)"
requests="${2:-80}"
load="${3:-0.6}"
offset="${4:-0}"
source "$(dirname "$0")/../tests/cluster/lib.sh"
trace_src="$src/tests/data/traces/azure2023_conv.csv"

python3 - "$trace_src" "$offset" "$requests" "$work/slice.jsonl" <<'PY'
import csv, datetime, json, sys
src, offset, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = list(csv.DictReader(open(src)))[offset:offset + n]
t = lambda r: datetime.datetime.fromisoformat(r["TIMESTAMP"][:26])
t0 = t(rows[0])
next_id = 1
with open(out, "w") as f:
    for r in rows:
        inp = max(16, round(int(r["ContextTokens"]) * 0.5))
        outp = min(64, max(4, round(int(r["GeneratedTokens"]) * 0.25)))
        blocks = (inp + 511) // 512
        ids = list(range(next_id, next_id + blocks))
        next_id += blocks
        ms = (t(r) - t0).total_seconds() * 1000
        f.write(json.dumps({"timestamp": round(ms, 3), "input_length": inp,
                            "output_length": outp, "hash_ids": ids}) + "\n")
PY

# The decode curve is timed as plain decode steps (one row per sequence) at the slice's
# mean context in decode (prompt + half the output).
ctx="$(python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(round(sum(x["input_length"]+x["output_length"]/2 for x in r)/len(r)))' "$work/slice.jsonl")"
pin_p="" pin_d=""
pin_r=""
if [[ "${SVL_PIN:-0}" != 0 ]]; then pin_p="taskset -c 0" pin_d="taskset -c 1"; fi
if [[ "${SVL_PIN:-0}" == 2 ]]; then pin_r="taskset -c 1"; taskset -pc 1 "$etcd_pid" > /dev/null; fi
echo "== calibrating (1 thread) ${pin_p:+pinned: $pin_p}"
$pin_p "$bin" calibrate --threads 1 --out "$work/cost.json" --verify-out "$work/verify.json" \
  --verify-tokens 1,2,4,8,16,32 --verify-tokens-per-seq 1 --verify-context "$ctx" > "$work/calibrate.out" 2>&1 || fail "calibrate failed"
grep -E "^(q |wrote)" "$work/calibrate.out"

# The cluster description from the calibration.
model_dir="$(ls -d "$HOME"/.cache/dsinfer/models/dsinfer-default-* | head -1)"
python3 - "$work/cost.json" "$work/verify.json" "$model_dir/config.json" "$work/cluster.json" <<'PY'
import json, sys
cost, verify, config = (json.load(open(p)) for p in sys.argv[1:4])
out = sys.argv[4]
pts = [(p["tokens"], p["ns"]) for p in verify["points"]]
n = len(pts)
mx = sum(x for x, _ in pts) / n
my = sum(y for _, y in pts) / n
slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
base = max(0.0, my - slope * mx)
context = verify.get("fit", {}).get("context", 256)
per_kv = cost["per_qc_ns"]
per_request = max(0.0, slope - per_kv * context)
layers = config["num_hidden_layers"] + config.get("num_nextn_predict_layers", 0)
kv_bytes = (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 4 * layers
desc = {"num_prefill": 1, "num_decode": 1,
        "prefill_cost": {k: cost[k] for k in ("base_ns", "per_q_ns", "per_c_ns", "per_qc_ns", "per_qq_ns")},
        "decode_base_ns": base, "decode_per_request_ns": per_request,
        "decode_per_kv_token_ns": per_kv, "kv_bytes_per_token": kv_bytes,
        "p2d_bytes_per_s": 1e9, "decode_join_recompute_block": 128, "device": "this machine, 1 thread per engine (dsinfer calibrate)"}
json.dump(desc, open(out, "w"), indent=1)
print("cluster description:", json.dumps(desc))
PY

"$bin" sim --trace "$work/slice.jsonl" --cluster "$work/cluster.json" --load "$load" \
  > "$work/sim.json" 2> "$work/sim.err" || fail "sim failed"
scale="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["runs"][0]["time_scale"])' "$work/sim.json")"
echo "== arrival scale at load $load: $scale"

echo "== live cluster"
m="etcd://127.0.0.1:$ecp/svl/"
START_PREFIX="$pin_p" start p serve --threads 1 --role prefill --membership "$m" --node-id p --cost-model "$work/cost.json"
pport=$last_port
START_PREFIX="$pin_d" start d serve --threads 1 --role decode --membership "$m" --node-id d --cost-model "$work/cost.json"
dport=$last_port
START_PREFIX="$pin_r" start r router --membership "$m"
rport=$last_port
for _ in $(seq 100); do
  [[ "$(curl -sf "http://127.0.0.1:$rport/metrics" | sed -n 's/^dsinfer_router_engines \([0-9]*\).*/\1/p')" == 2 ]] && break
  sleep 0.1
done
$pin_r "$bin" bench serve --base-url "http://127.0.0.1:$rport" --model dsinfer-default \
  --endpoint completions --dataset trace --trace "$work/slice.jsonl" --num-prompts 0 \
  --trace-time-scale "$scale" --concurrency 100000 --out-json "$work/live.json" \
  --fail-on-error > "$work/live.out" 2>&1 || fail "the live replay failed: $(tail -5 "$work/live.out")"
grep -E "^[0-9]" "$work/live.out" | head -3 || true
# The engines' own step counts and forward time: what the live run's steps cost.
for e in p:$pport d:$dport; do
  curl -sf "http://127.0.0.1:${e#*:}/metrics" > "$work/metrics_${e%%:*}.txt" || true
done
python3 - "$work/metrics_p.txt" "$work/metrics_d.txt" <<'PY'
import sys
for name, path in zip(("prefill", "decode"), sys.argv[1:]):
    m = {}
    for line in open(path):
        if line.startswith("dsinfer_") and " " in line:
            k, v = line.split()[:2]
            m[k] = float(v)
    steps = m.get("dsinfer_engine_steps_total", 0)
    fwd = m.get("dsinfer_engine_forward_seconds_total", 0)
    print(f"{name} engine: {steps:.0f} steps, forward {fwd:.2f} s, "
          f"{1000 * fwd / steps if steps else 0:.2f} ms a step, "
          f"output tokens {m.get('dsinfer_engine_output_tokens_total', 0):.0f}, "
          f"prompt tokens {m.get('dsinfer_engine_prompt_tokens_total', 0):.0f}")
PY

python3 - "$work/sim.json" "$work/live.json" <<'PY'
import json, sys
sim = json.load(open(sys.argv[1]))["runs"][0]
live = json.load(open(sys.argv[2]))["runs"][0]
print(f"requests: sim {sim['requests']}, live {live['num_ok']} ok, {live['num_errors']} failed")
print("| metric | sim ms | live ms | sim / live |")
print("|---|---:|---:|---:|")
for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms")):
    for p in ("p50", "p90", "p99"):
        s, l = sim[key][p], live[key][p]
        print(f"| {name} {p} | {s:.1f} | {l:.1f} | {s / l if l else float('nan'):.2f} |")
PY
