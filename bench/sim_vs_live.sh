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
# SVL_PIN=2 also puts the router, etcd and the client on CPU 1.
#
# Step-record fit (SVL_FIT_OFFSET=N): first a live run on the slice of REQUESTS at
# offset N (apart from the predicted one), each engine writing its steps (`serve
# --step-log`); `dsinfer sim --fit-prefill-steps/--fit-decode-steps` fits the
# simulator's prefill time scale and step overhead and its decode step model to them
# (sim/step_fit.h) into step_fit.json beside the calibration's cost.json; the predicted
# slice is then simulated with `--step-fit step_fit.json` over the calibrated
# description (and without it, for comparison), at the arrival scale the fitted
# simulator gives for LOAD. SVL_REPS=K replays the predicted slice K times live (fresh
# engines, router and membership prefix each time: no prefix cache carries over) and
# prints each run's sim / live and the medians. SVL_KEEP=DIR keeps the calibration, the
# fit, the step logs, the engines' /metrics and the results there. SVL_FIT_REPS=K fits
# to K live runs of the fit slice pooled. Every live run prints its engines' steps
# against the calibration (prefill steps by prompts in the step: wall and worker CPU
# time over the calibrated cost; the host gap before back-to-back steps) and the CPU
# busy time beside it (CPU 0 less the prefill engine: what others took from it).
# SVL_INTERLEAVE=1 alternates fit and predicted runs (fit 1, predicted 1, fit 2, ...) and
# pools every fit run: the machine's speed drifts over a batch, and a fit made before all
# predicted runs carries its own moment's speed into them.
# SVL_FIT_SCALES=1,0.6,0.45 (arrival-scale factors of the fit runs): the fit slice at
# load LOAD runs the decode engine at much smaller batches than the predicted slice, and
# a decode model fitted there is short on full batches; the factors send fit runs 2 and
# 3 faster so the pooled fit covers them. The script prints each run's decode batch per
# token made beside the simulator's (bench/RESULTS.md, session 21 batches).
# The live hops (bench/sim_vs_live_hops.py: the router's quota pricing, its dispatch and
# quota release, the hand-over's latency to the decode scheduler, the async join) are
# fitted from the fit runs' request records (`bench serve --records-out`) and step logs
# and added to the step fit; every simulation gets the router's quota
# (--prefill-quota-ms 250). Live percentiles are computed from the records with the
# simulator's estimator (bench serve's nearest rank makes p99 of 80 requests the largest).
set -euo pipefail
build="$(cd "${1:-build}" && pwd)"
requests="${2:-80}"
load="${3:-0.6}"
offset="${4:-0}"
fit_offset="${SVL_FIT_OFFSET:-}"
reps="${SVL_REPS:-1}"
keep="${SVL_KEEP:-}"
source "$(dirname "$0")/../tests/cluster/lib.sh"
trace_src="$src/tests/data/traces/azure2023_conv.csv"

make_slice() {  # make_slice OFFSET OUT
  python3 - "$trace_src" "$1" "$requests" "$2" <<'PY'
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
}
make_slice "$offset" "$work/slice.jsonl"
[[ -n "$fit_offset" ]] && make_slice "$fit_offset" "$work/fit_slice.jsonl"

# The decode curve is timed as plain decode steps (one row per sequence) at the slice's
# mean context in decode (prompt + half the output).
ctx="$(python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(round(sum(x["input_length"]+x["output_length"]/2 for x in r)/len(r)))' "$work/slice.jsonl")"
pin_p="" pin_d=""
pin_r=""
if [[ "${SVL_PIN:-0}" != 0 ]]; then pin_p="taskset -c 0" pin_d="taskset -c 1"; fi
if [[ "${SVL_PIN:-0}" == 2 ]]; then pin_r="taskset -c 1"; taskset -pc 1 "$etcd_pid" > /dev/null; fi
echo "== $(date -u +%H:%M:%S) calibrating (1 thread) ${pin_p:+pinned: $pin_p}; load average $(cut -d' ' -f1-3 /proc/loadavg)"
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

sim_scale() {  # sim_scale TRACE OUT [--step-fit F]: simulate at LOAD, print the arrival scale
  local trace="$1" out="$2"
  shift 2
  "$bin" sim --trace "$trace" --cluster "$work/cluster.json" "$@" --load "$load" --prefill-quota-ms "$quota_ms" \
    > "$out" 2> "$out.err" || fail "sim failed: $(tail -3 "$out.err")"
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["runs"][0]["time_scale"])' "$out"
}

# The engines' steps against the calibration: prefill steps grouped by the prompts in
# them (wall and worker-CPU time over the calibrated cost of their chunks), the host gap
# before back-to-back steps, decode steps' wall over CPU.
step_report() {  # step_report PREFILL_LOG DECODE_LOG
  python3 - "$work/cost.json" "$1" "$2" <<'PY'
import json, statistics, sys
cost = json.load(open(sys.argv[1]))
def cal(q, c):
    if q == 0:
        return 0.0
    return (cost["base_ns"] + cost["per_q_ns"] * q + cost["per_c_ns"] * c +
            cost["per_qc_ns"] * q * c + cost["per_qq_ns"] * q * q)
def load(path):
    steps = [json.loads(l) for l in open(path) if l.strip()]
    steps.sort(key=lambda s: s["start_ns"])
    prev = None
    for s in steps:
        s["gap"] = s["start_ns"] - prev if prev is not None else None
        prev = s["end_ns"]
    return [s for s in steps if s["items"]]
p, d = load(sys.argv[2]), load(sys.argv[3])
groups = {}
for s in p:
    k = min(len(s["items"]), 3)
    groups.setdefault(k, []).append(s)
print("prefill steps by prompts in the step: steps, tokens, wall / calibrated, CPU / calibrated, wall / CPU (sums)")
for k in sorted(groups):
    g = groups[k]
    c = sum(cal(q, ctx) for s in g for q, ctx in s["items"])
    w = sum(s["end_ns"] - s["start_ns"] for s in g)
    u = sum(s["cpu_ns"] for s in g)
    toks = sum(q for s in g for q, _ in s["items"])
    print(f"  {k if k < 3 else '3+'} prompts: {len(g)} steps, {toks} tokens, "
          f"wall/cal {w / c:.2f}, cpu/cal {u / c:.2f}, wall/cpu {w / u:.2f}")
allc = sum(cal(q, ctx) for s in p for q, ctx in s["items"])
allw = sum(s["end_ns"] - s["start_ns"] for s in p)
allu = sum(s["cpu_ns"] for s in p)
gaps = [s["gap"] for s in p if s["gap"] is not None and s["gap"] <= 1e6]
print(f"  all: {len(p)} steps, wall/cal {allw / allc:.2f}, cpu/cal {allu / allc:.2f}, "
      f"wall/cpu {allw / allu:.2f}; back-to-back host gap median "
      f"{statistics.median(gaps) / 1e3 if gaps else 0:.0f} us ({len(gaps)} steps)")
dw = sum(s["end_ns"] - s["start_ns"] for s in d)
du = sum(s["cpu_ns"] for s in d)
sizes = [len(s["items"]) for s in d]
print(f"decode steps: {len(d)}, batch median {statistics.median(sizes) if sizes else 0}, "
      f"wall median {statistics.median([s['end_ns'] - s['start_ns'] for s in d]) / 1e6:.2f} ms, "
      f"wall/cpu {dw / du if du else 0:.2f}")
PY
}

# Busy CPU time of each CPU (/proc/stat) and of the run's processes, so a run can say
# how much CPU others took beside it: with SVL_PIN=2 CPU 0 runs the prefill engine only.
cpu_snapshot() {  # cpu_snapshot PIDS... -> JSON {"cpus": [...], "pids": {...}} (seconds)
  python3 - "$@" <<'PY'
import json, os, sys
hz = os.sysconf("SC_CLK_TCK")
cpus = []
for line in open("/proc/stat"):
    f = line.split()
    if f[0].startswith("cpu") and f[0] != "cpu":
        v = list(map(int, f[1:]))
        cpus.append((sum(v) - v[3] - v[4]) / hz)  # all but idle and iowait
pids = {}
for p in sys.argv[1:]:
    try:
        f = open(f"/proc/{p}/stat").read().rsplit(") ", 1)[1].split()
        pids[p] = (int(f[11]) + int(f[12])) / hz
    except OSError:
        pass
print(json.dumps({"cpus": cpus, "pids": pids}))
PY
}
cpu_report() {  # cpu_report BEFORE AFTER PREFILL_PID
  python3 - "$@" <<'PY'
import json, sys
b, a = (json.load(open(p)) for p in sys.argv[1:3])
pid = sys.argv[3]
busy = [y - x for x, y in zip(b["cpus"], a["cpus"])]
ours = a["pids"].get(pid, 0) - b["pids"].get(pid, 0)
print("  CPU busy during the run: " + ", ".join(f"cpu{i} {t:.2f} s" for i, t in enumerate(busy)) +
      f"; the prefill engine {ours:.2f} s (cpu0 less the prefill engine: {busy[0] - ours:.2f} s)")
open(sys.argv[4], "w").write(f"{busy[0] - ours:.3f}\n")
PY
}

# A live run whose CPU 0 others used for more than SVL_MAX_FOREIGN_CPU_S (default 1 s:
# a quiet run leaves 0.2-0.5 s there) measured the machine, not dsinfer: it is run again,
# up to twice (SVL_PIN=2 only: unpinned, CPU 0 carries the run's own processes).
live_run_checked() {  # live_run_checked NAME TRACE SCALE
  local try
  for try in 1 2 3; do
    live_run "$@"
    [[ "${SVL_PIN:-0}" == 2 ]] || return 0
    if python3 -c 'import sys; sys.exit(float(open(sys.argv[1]).read()) > float(sys.argv[2]))' \
      "$work/foreign_cpu_$1.txt" "${SVL_MAX_FOREIGN_CPU_S:-1}"; then
      return 0
    fi
    echo "  (others used CPU 0 for $(cat "$work/foreign_cpu_$1.txt") s: run $1 again)"
  done
  echo "  (run $1 kept after 3 tries: the machine is not quiet)"
}

# One live run: fresh engines (writing their steps), router and membership prefix.
live_run() {  # live_run NAME TRACE SCALE
  local name="$1" trace="$2" scale="$3"
  live_seq=$((${live_seq:-0} + 1))  # a run again gets a fresh membership prefix too
  local m="etcd://127.0.0.1:$ecp/svl_${name}_$live_seq/"
  local run_pids=()
  START_PREFIX="$pin_p" start "p_$name" serve --threads 1 --role prefill --membership "$m" \
    --node-id "p_$name" --cost-model "$work/cost.json" --step-log "$work/steps_p_$name.jsonl"
  local pport=$last_port
  run_pids+=("$last_pid")
  START_PREFIX="$pin_d" start "d_$name" serve --threads 1 --role decode --membership "$m" \
    --node-id "d_$name" --cost-model "$work/cost.json" --step-log "$work/steps_d_$name.jsonl"
  local dport=$last_port
  run_pids+=("$last_pid")
  START_PREFIX="$pin_r" start "r_$name" router --membership "$m" --cost-model "$work/cost.json"
  local rport=$last_port
  run_pids+=("$last_pid")
  for _ in $(seq 100); do
    [[ "$(curl -sf "http://127.0.0.1:$rport/metrics" | sed -n 's/^dsinfer_router_engines \([0-9]*\).*/\1/p')" == 2 ]] && break
    sleep 0.1
  done
  echo "== $(date -u +%H:%M:%S) live run $name (arrival scale $scale); load average $(cut -d' ' -f1-3 /proc/loadavg)"
  cpu_snapshot "${run_pids[@]}" > "$work/cpu_before_$name.txt"
  $pin_r "$bin" bench serve --base-url "http://127.0.0.1:$rport" --model dsinfer-default \
    --endpoint completions --dataset trace --trace "$trace" --num-prompts 0 \
    --trace-time-scale "$scale" --concurrency 100000 --out-json "$work/live_$name.json" \
    --records-out "$work/records_$name.jsonl" \
    --fail-on-error > "$work/live_$name.out" 2>&1 || fail "the live replay failed: $(tail -5 "$work/live_$name.out")"
  # The engines' own step counts and forward time: what the live run's steps cost.
  for e in p:$pport d:$dport r:$rport; do
    curl -sf "http://127.0.0.1:${e#*:}/metrics" > "$work/metrics_${e%%:*}_$name.txt" || true
  done
  python3 - "$work/metrics_p_$name.txt" "$work/metrics_d_$name.txt" <<'PY'
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
    sent = m.get("dsinfer_kv_handoff_sent_total", 0)
    if sent:
        print(f"  KV hand-overs: {sent:.0f} sent, {m.get('dsinfer_kv_handoff_failed_total', 0):.0f} "
              f"failed, export -> Ack mean "
              f"{m.get('dsinfer_kv_handoff_sent_microseconds_total', 0) / sent / 1000:.2f} ms")
PY
  step_report "$work/steps_p_$name.jsonl" "$work/steps_d_$name.jsonl"
  cpu_snapshot "${run_pids[@]}" > "$work/cpu_after_$name.txt"
  cpu_report "$work/cpu_before_$name.txt" "$work/cpu_after_$name.txt" "${run_pids[0]}" \
    "$work/foreign_cpu_$name.txt"
  for p in "${run_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${run_pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

# The router's S-LB quota (`dsinfer router --prefill-quota-ms`, its default): the
# simulator's prefill LB gets the same.
quota_ms=250
# fit_from RUN...: the step fit and the hops fit pooled over the named live runs of the
# fit slice, into $work/step_fit.json (steps only) and $work/step_fit_hops.json.
fit_from() {
  : > "$work/steps_p_fit_all.jsonl"
  : > "$work/steps_d_fit_all.jsonl"
  local r
  for r in "$@"; do
    cat "$work/steps_p_$r.jsonl" >> "$work/steps_p_fit_all.jsonl"
    cat "$work/steps_d_$r.jsonl" >> "$work/steps_d_fit_all.jsonl"
  done
  echo "== step fit (slice at offset $fit_offset; runs $*)"
  "$bin" sim --cluster "$work/cluster.json" --fit-prefill-steps "$work/steps_p_fit_all.jsonl" \
    --fit-decode-steps "$work/steps_d_fit_all.jsonl" --fit-out "$work/step_fit.json" \
    > "$work/step_fit_report.json" 2> "$work/step_fit.err" || fail "step fit failed: $(cat "$work/step_fit.err")"
  python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$work/step_fit_report.json"
  # The live hops and admission (the router's pricing, dispatch and quota release, the
  # hand-over's latency to the decode scheduler, the async join), fitted from the same
  # runs' request records and step logs, over the step fit.
  python3 "$src/bench/sim_vs_live_hops.py" "$work" "$work/cluster.json" "$@" \
    > "$work/hops.json" 2> "$work/hops.err" || fail "hops fit failed: $(cat "$work/hops.err")"
  echo "hops fit: $(cat "$work/hops.json") $(cat "$work/hops.err")"
  python3 - "$work/step_fit.json" "$work/hops.json" "$work/step_fit_hops.json" <<'PY'
import json, sys
fit, hops = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
json.dump({**fit, **hops}, open(sys.argv[3], "w"), indent=1)
PY
}

step_fit=()
fit_reps="${SVL_FIT_REPS:-1}"
# fit_run_scale N: the arrival scale of fit run N: the fit slice's scale at LOAD times the
# N-th factor of SVL_FIT_SCALES (comma separated, cycled; default 1). Factors below 1
# send the same requests closer together: the decode engine then runs the larger batches
# a burstier predicted slice meets, and the pooled fit covers them.
fit_run_scale() {
  python3 -c 'import sys; f=[float(x) for x in sys.argv[2].split(",")]; print(float(sys.argv[1]) * f[(int(sys.argv[3]) - 1) % len(f)])' \
    "$fit_scale" "${SVL_FIT_SCALES:-1}" "$1"
}
if [[ -n "$fit_offset" && "${SVL_INTERLEAVE:-0}" != 0 ]]; then
  # Interleaved (SVL_INTERLEAVE=1): the machine's speed drifts by ~10 % over a batch
  # (bench/RESULTS.md), so fit runs and predicted runs alternate -- fit 1, predicted 1,
  # fit 2, predicted 2, ... -- and the fit pools every fit run. The arrival scale must be
  # fixed before the first predicted run: it is the one the simulator fitted to fit run 1
  # gives for LOAD; the final simulation replays the slice at that same scale with the
  # fit pooled over all fit runs.
  fit_scale="$(sim_scale "$work/fit_slice.jsonl" "$work/fit_sim.json")"
  live_run_checked fit1 "$work/fit_slice.jsonl" "$(fit_run_scale 1)"
  fit_from fit1
  scale="$(sim_scale "$work/slice.jsonl" "$work/sim_fit1.json" --step-fit "$work/step_fit_hops.json")"
  echo "== arrival scale at load $load (fit run 1): $scale"
  fit_runs=(fit1)
  for rep in $(seq "$reps"); do
    live_run_checked "$rep" "$work/slice.jsonl" "$scale"
    if (( rep < fit_reps )); then
      live_run_checked "fit$((rep + 1))" "$work/fit_slice.jsonl" "$(fit_run_scale $((rep + 1)))"
      fit_runs+=("fit$((rep + 1))")
    fi
  done
  fit_from "${fit_runs[@]}"
  step_fit=(--step-fit "$work/step_fit_hops.json")
  "$bin" sim --trace "$work/slice.jsonl" --cluster "$work/cluster.json" "${step_fit[@]}" \
    --time-scale "$scale" --prefill-quota-ms "$quota_ms" --records-out "$work/sim_records.jsonl" \
    --decode-steps-out "$work/sim_decode_steps.jsonl" > "$work/sim.json" 2> "$work/sim.json.err" ||
    fail "sim failed: $(tail -3 "$work/sim.json.err")"
else
  if [[ -n "$fit_offset" ]]; then
    fit_scale="$(sim_scale "$work/fit_slice.jsonl" "$work/fit_sim.json")"
    # The engines' speed moves between identical runs (bench/RESULTS.md): the fit pools
    # SVL_FIT_REPS runs' steps (steady-clock times: the runs never overlap).
    fit_runs=()
    for rep in $(seq "$fit_reps"); do
      live_run_checked "fit$rep" "$work/fit_slice.jsonl" "$(fit_run_scale "$rep")"
      fit_runs+=("fit$rep")
    done
    fit_from "${fit_runs[@]}"
    step_fit=(--step-fit "$work/step_fit_hops.json")
  fi
  scale="$(sim_scale "$work/slice.jsonl" "$work/sim.json" "${step_fit[@]}")"
  echo "== arrival scale at load $load: $scale"
  for rep in $(seq "$reps"); do
    live_run_checked "$rep" "$work/slice.jsonl" "$scale"
  done
fi
if [[ -n "$fit_offset" ]]; then  # for comparison, same arrivals: the step fit without the
  # hops, and the calibration alone
  "$bin" sim --trace "$work/slice.jsonl" --cluster "$work/cluster.json" --step-fit "$work/step_fit.json" \
    --time-scale "$scale" --prefill-quota-ms "$quota_ms" > "$work/sim_step_fit_only.json" 2> /dev/null ||
    fail "sim (step fit only) failed"
  "$bin" sim --trace "$work/slice.jsonl" --cluster "$work/cluster.json" --time-scale "$scale" \
    --prefill-quota-ms "$quota_ms" > "$work/sim_calibration_only.json" 2> /dev/null ||
    fail "sim (calibration only) failed"
fi

python3 - "$work" "$reps" <<'PY'
import json, os, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
sims = {"sim": json.load(open(f"{work}/sim.json"))["runs"][0]}
if os.path.exists(f"{work}/sim_step_fit_only.json"):
    sims["sim, step fit without the hops"] = json.load(open(f"{work}/sim_step_fit_only.json"))["runs"][0]
if os.path.exists(f"{work}/sim_calibration_only.json"):
    sims["sim, calibration only"] = json.load(open(f"{work}/sim_calibration_only.json"))["runs"][0]
# Live percentiles from the per-request records with the simulator's estimator
# (sim::distribution: the value at index round(p x (n - 1)) of the sorted list);
# `bench serve`'s own report uses nearest rank (ceil(p x n)), whose p99 of 80 requests is
# the largest, where the simulator's is the second largest.
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))] if v else float("nan")
def live_run(r):
    recs = [json.loads(l) for l in open(f"{work}/records_{r}.jsonl") if l.strip()]
    ok = [x for x in recs if x["ok"]]
    ttft = [x["ttft_ns"] / 1e6 for x in ok]
    tpot = [(x["e2e_ns"] - x["ttft_ns"]) / 1e6 / (x["output_tokens"] - 1) for x in ok if x["output_tokens"] > 1]
    report = json.load(open(f"{work}/live_{r}.json"))["runs"][0]
    return {"num_ok": report["num_ok"], "num_errors": report["num_errors"],
            "ttft_ms": {p: pct(ttft, q) for p, q in (("p50", .5), ("p90", .9), ("p99", .99))},
            "tpot_ms": {p: pct(tpot, q) for p, q in (("p50", .5), ("p90", .9), ("p99", .99))},
            "report": report}
lives = [live_run(r) for r in range(1, reps + 1)]
print(f"requests: sim {sims['sim']['requests']}, live " +
      ", ".join(f"{l['num_ok']} ok / {l['num_errors']} failed" for l in lives))
keys = [(n, k, p) for n, k in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms")) for p in ("p50", "p90", "p99")]
print("live, bench serve's nearest-rank report (median of the runs): " + ", ".join(
    f"{n} {p} {statistics.median(l['report'][k][p] for l in lives):.1f}" for n, k, p in keys))
# The decode batches each side ran, counted per token (the batch a token was made in):
# a fit whose runs never reached the predicted runs' batches extrapolates its decode
# costs (SVL_FIT_SCALES below 1 sends the fit slice faster).
def token_batches(path, key):
    sizes = []
    for line in open(path):
        if line.strip():
            s = json.loads(line)
            n = s["running"] if key == "running" else len(s["items"])
            sizes += [n] * n
    return sorted(sizes)
def batch_line(label, sizes):
    return f"{label} {pct(sizes, .5):.0f} / {pct(sizes, .9):.0f}" if sizes else f"{label} -"
import glob
fit_steps = sorted(glob.glob(f"{work}/steps_d_fit[0-9]*.jsonl"))
parts = [batch_line(os.path.basename(f)[8:-6], token_batches(f, "items")) for f in fit_steps]
parts += [batch_line(f"predicted {r}", token_batches(f"{work}/steps_d_{r}.jsonl", "items"))
          for r in range(1, reps + 1) if os.path.exists(f"{work}/steps_d_{r}.jsonl")]
if os.path.exists(f"{work}/sim_decode_steps.jsonl"):
    parts.append(batch_line("sim", token_batches(f"{work}/sim_decode_steps.jsonl", "running")))
if parts:
    print("decode batch per token made, p50 / p90: " + ", ".join(parts))
for label, sim in sims.items():
    print(f"\n{label} vs live, ms (sim / live per run; median of the ratios)")
    print("| metric | sim | " + " | ".join(f"live {r}" for r in range(1, reps + 1)) +
          " | live median (min-max) | sim / live median |")
    print("|---|---:|" + "---:|" * reps + "---:|---:|")
    for n, k, p in keys:
        s = sim[k][p]
        ls = [l[k][p] for l in lives]
        ratios = [s / l if l else float("nan") for l in ls]
        print(f"| {n} {p} | {s:.1f} | " + " | ".join(f"{l:.1f} ({r:.2f})" for l, r in zip(ls, ratios)) +
              f" | {statistics.median(ls):.1f} ({min(ls):.1f}-{max(ls):.1f}) | **{statistics.median(ratios):.2f}** |")
PY

if [[ -n "$keep" ]]; then
  mkdir -p "$keep"
  cp "$work"/cost.json "$work"/verify.json "$work"/cluster.json "$work"/sim*.json "$work"/live_*.json \
    "$work"/steps_*.jsonl "$work"/records_*.jsonl "$work"/sim_*.jsonl "$work"/*slice.jsonl "$work"/metrics_*.txt "$keep"/ 2>/dev/null || true
  [[ -f "$work/step_fit.json" ]] && cp "$work/step_fit.json" "$work/step_fit_report.json" \
    "$work/hops.json" "$work/step_fit_hops.json" "$work"/r_*.out "$keep"/
  echo "kept in $keep"
fi
