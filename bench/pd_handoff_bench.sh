#!/usr/bin/env bash
# The KV hand-over's worth (issue 18 figure): the gap between the first and the second
# token of a disaggregated stream (the prefill engine's first token, then the decode
# engine's), with the prompt's KV handed over (transfer/ into the decode engine's inbox)
# vs without it (the decode engine computes the prompt again), measured in the same run,
# plus the streams' ordinary gap between tokens.
#   bench/pd_handoff_bench.sh [BUILD_DIR] [ROUNDS] [PROMPT_REPEATS] [MODEL_DIR]
# MODEL_DIR: a checkpoint every process serves (default: the embedded default model), e.g.
# `dsinfer make-model --preset tiny-v4 --format hf --out DIR` for the V4 hand-over (blocks
# of every cache group and the SWA state).
# etcd + two clusters on loopback, each a prefill engine, a decode engine and a router
# (`serve --role prefill|decode`, default model, 1 thread each): A's decode engine runs
# an inbox, B's does not (--kv-transfer-port -1). Each round sends one new prompt (a
# round number in front, so nothing is cached) to A and to B, alternating which goes
# first; the streams must be equal. Prints medians and min-max. Run it under
# `flock /work/.bench.lock` on a quiet machine.
set -euo pipefail
build="$(cd "${1:-build}" && pwd)"
rounds="${2:-7}"
repeats="${3:-120}"
model_args=() served="dsinfer-default"
if [[ -n "${4:-}" ]]; then
  model_args=(--model "$(cd "$4" && pwd)") served="$(basename "$(cd "$4" && pwd)")"
fi
source "$(dirname "$0")/../tests/cluster/lib.sh"
declare -A rport
for c in A B; do
  m="etcd://127.0.0.1:$ecp/$c/"
  extra=()
  [[ "$c" == B ]] && extra=(--kv-transfer-port -1)
  start "p$c" serve --threads 1 --role prefill --membership "$m" --node-id "p$c" "${model_args[@]}"
  start "d$c" serve --threads 1 --role decode --membership "$m" --node-id "d$c" "${extra[@]}" \
    "${model_args[@]}"
  start "r$c" router --membership "$m" "${model_args[@]}"
  rport[$c]=$last_port
done
results="$work/results.jsonl"
for i in $(seq "$rounds"); do
  order=(A B)
  (( i % 2 == 0 )) && order=(B A)
  for c in "${order[@]}"; do
    python3 - "http://127.0.0.1:${rport[$c]}/v1/completions" "$c" "$i" "$repeats" "$served" \
      >> "$results" <<'PY'
import http.client, json, sys, time, urllib.parse
url, cluster, rnd, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
served = sys.argv[5]
prompt = f"Round {rnd}. " + " ".join(["The cat sat on the mat and looked at the moon."] * repeats)
body = json.dumps({"model": served, "prompt": prompt,
                   "max_tokens": 32, "temperature": 0.8, "seed": 5, "ignore_eos": True,
                   "stream": True, "stream_options": {"include_usage": True}, "logprobs": 1})
u = urllib.parse.urlparse(url)
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
t0 = time.monotonic()
conn.request("POST", u.path, body, {"Content-Type": "application/json"})
resp = conn.getresponse()
times, content, usage, buf = [], "", None, b""
while True:
    chunk = resp.read1(65536)
    if not chunk:
        break
    buf += chunk
    while b"\n\n" in buf:
        event, buf = buf.split(b"\n\n", 1)
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            continue
        j = json.loads(event[6:])
        if j.get("usage"):
            usage = j["usage"]
        for ch in j.get("choices", []):
            # One event per token, whatever its text (a first token may print nothing).
            for tok in (ch.get("logprobs") or {}).get("tokens", []):
                times.append(time.monotonic() - t0)
                content += tok
gaps = [b - a for a, b in zip(times, times[1:])]
print(json.dumps({"cluster": cluster, "round": rnd, "ttft": times[0], "handover_gap": gaps[0],
                  "ordinary_gaps": gaps[2:], "content": content,
                  "prompt_tokens": usage["prompt_tokens"] if usage else None}))
PY
  done
done
metric() { curl -sf "http://127.0.0.1:$1/metrics" | sed -n "s/^$2 \([0-9.e+]*\)$/\1/p" | cut -d. -f1; }
sent_us="$(metric "$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/pA.out")" dsinfer_kv_handoff_sent_microseconds_total)"
echo "prefill engine A: export -> Ack of the hand-overs, mean $(( sent_us / rounds )) us"
dport="$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/dA.out")"
echo "decode engine A: landed in its pool $(metric "$dport" dsinfer_kv_inbox_landed_total), tail tokens attached $(metric "$dport" dsinfer_kv_landing_tail_tokens_total), store-tier fallbacks $(metric "$dport" dsinfer_kv_inbox_landing_fallbacks_total), stored in the store tier $(metric "$dport" dsinfer_kv_inbox_blocks_total) blocks"
echo "router A: kv hand-overs $(metric "${rport[A]}" dsinfer_router_kv_handoffs_total), failed $(metric "${rport[A]}" dsinfer_router_kv_handoffs_failed_total); router B: $(metric "${rport[B]}" dsinfer_router_kv_handoffs_total)"
[[ -n "${PD_BENCH_DEBUG:-}" ]] && cut -c1-600 "$results"
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["round"], {})[r["cluster"]] = r
for rnd, pair in by.items():
    assert pair["A"]["content"] == pair["B"]["content"], f"round {rnd}: the streams differ"
def stat(xs):
    xs = sorted(xs)
    return f"median {statistics.median(xs)*1000:.1f} ms (min {xs[0]*1000:.1f}, max {xs[-1]*1000:.1f}, n={len(xs)})"
for c, name in (("A", "with the KV hand-over"), ("B", "without (decode recomputes the prompt)")):
    rs = [r for r in rows if r["cluster"] == c]
    print(f"cluster {c}, {name}: prompt {rs[0]['prompt_tokens']} tokens")
    print(f"  first token (prefill engine)      {stat([r['ttft'] for r in rs])}")
    print(f"  first -> second token (hand-over) {stat([r['handover_gap'] for r in rs])}")
    print(f"  ordinary gap between tokens       {stat([g for r in rs for g in r['ordinary_gaps']])}")
print(f"every round's streams equal (A == B): {len(by)} rounds")
PY
