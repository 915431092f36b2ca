#!/usr/bin/env bash
# The cluster as processes on loopback (issue 18): etcd + two engines
# (`dsinfer serve --role both --membership etcd://...`) + `dsinfer router`, on the
# embedded default model. Drills, each checked against the stream one engine gives
# alone (same seed: batch-invariant kernels and the counter-based sampler make every
# engine produce the same tokens):
#   1. the router answers a streamed request exactly as an engine does;
#   2. kill -9 the engine serving a stream mid-way: the stream continues on the other
#      engine without a seam (same content, ends with [DONE]); the router's
#      directory drops the dead engine when its lease (3 s) runs out;
#   3. etcd stopped (SIGSTOP) while requests flow: they still complete (the router
#      routes on the engines it knows); etcd back: the survivor is still listed;
#   4. drain (SIGTERM) the engine serving a stream, with a grace shorter than the
#      stream: it leaves the directory at once, aborts at the end of its grace, the
#      stream continues on a third engine unchanged; the drained engine exits 0;
#   5. `dsinfer cluster up --prefill 1 --decode 1` (its own etcd) answers a chat
#      completion through its router, hands a long prompt's KV over, and Ctrl-C (SIGINT)
#      stops every process it started;
#   6. disaggregated: a prefill engine and a decode engine (also sharing a file:// KV
#      store); the stream is the reference one; the prefill engine sampled only the
#      first token and handed the prompt's full blocks to the decode engine's inbox
#      (transfer/ over TCP), where the decode engine took them as prefix hits; the same
#      prompt again is found in the shared store by the router's prefix check and
#      skips prefill;
#   6b. the same with `--ep 2` on both engines (decode `--ep-front off`): the hand-over
#      lands in the decode engine's rank 0, its continuation follows by prefix;
#   7. with a second prefill and decode engine: kill -9 the decode engine serving a
#      stream, then the prefill engine running a request; both complete unchanged and
#      the survivors hold no KV block once idle;
#   8. `cluster up --autoscale`: a second decode engine is started under load and
#      drained when the load is gone;
#   9. `cluster up --prefill 1 --decode 1` on tiny-v4: the blocks of every cache group
#      and the SWA state are handed over, the decode engine continues from the state
#      (an exact SWA hit, no replay), and the stream equals a single engine's.
# Prints the counts and the time from the kill to the next token.
# Usage: failover_drill.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
membership="etcd://127.0.0.1:$ecp/drill/"

engine_args=(serve --threads 1 --role both --membership "$membership" --lease-ttl-s 3
  --drain-grace-ms 300)
start e1 "${engine_args[@]}" --node-id e1
e1_pid=$last_pid e1_port=$last_port
start e2 "${engine_args[@]}" --node-id e2
e2_pid=$last_pid e2_port=$last_port
start router router --membership "$membership" --lease-ttl-s 3
router_port=$last_port
grep -q "2 engine(s)" "$work/router.out" || fail "router does not list both engines"
# The router prices the S-LB quota with the engines' fit (the embedded default model's,
# beside it in the shared model cache), not the conservative estimate; a --cost-model
# that does not exist is an error before it serves.
grep -q "prefill quota priced by .*dsinfer_prefill_cost.json)" "$work/router.out" ||
  fail "router does not price with the engines' cost fit: $(grep 'priced by' "$work/router.out")"
if "$bin" router --membership "$membership" --port 0 --cost-model "$work/none.json" \
  > "$work/router_bad.out" 2>&1; then
  fail "router started with a missing --cost-model"
fi
grep -q "NOT_FOUND: --cost-model .*none.json does not exist" "$work/router_bad.out" ||
  fail "router's --cost-model error: $(cat "$work/router_bad.out")"

body='{"model":"dsinfer-default","messages":[{"role":"user","content":"Tell me a story about a cat."}],
       "stream":true,"max_tokens":160,"temperature":0.8,"seed":4242,"ignore_eos":true}'
client="$src/tests/cluster/stream_client.py"
content() { python3 -c 'import json,sys; print(json.load(sys.stdin)["content"])'; }

# 1. The router answers as one engine does.
ref="$(python3 "$client" "http://127.0.0.1:$e1_port/v1/chat/completions" "$body")"
ref_content="$(content <<< "$ref")"
[[ -n "$ref_content" ]] || fail "the engine gave no content"
via="$(python3 "$client" "http://127.0.0.1:$router_port/v1/chat/completions" "$body")"
[[ "$(content <<< "$via")" == "$ref_content" ]] || fail "router stream differs from the engine's"
echo "drill 1: router stream == engine stream ($(python3 -c 'import json,sys; print(json.load(sys.stdin)["chunks"])' <<< "$via") chunks)"

# 2. kill -9 the engine serving the stream after 20 chunks.
out="$(python3 "$client" "http://127.0.0.1:$router_port/v1/chat/completions" "$body" \
  --kill-after 20 --engines "$e1_port:$e1_pid,$e2_port:$e2_pid")"
python3 - "$out" "$ref_content" <<'PY' || fail "drill 2"
import json, sys
out, ref = json.loads(sys.argv[1]), sys.argv[2]
assert out["killed_pid"], "no engine was running the stream at chunk 20"
assert out["done"], "the stream did not end with [DONE]"
assert "error" not in out, out.get("error")
assert out["content"] == ref, "content differs after failover"
print(f"drill 2: killed pid {out['killed_pid']} after 20 chunks; next token "
      f"{out['resume_s']:.3f} s after the kill; content == reference ({out['chunks']} chunks)")
PY
killed="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["killed_pid"])' <<< "$out")"
if [[ "$killed" == "$e1_pid" ]]; then alive_port=$e2_port; dead=e1; else alive_port=$e1_port; dead=e2; fi
# Its lease (3 s) runs out: the directory drops it.
for _ in $(seq 200); do
  listed="$(curl -sf -X POST "http://127.0.0.1:$ecp/v3/kv/range" \
    -d "{\"key\":\"$(printf /drill/%s "$dead" | base64)\"}")"
  grep -q '"kvs"' <<< "$listed" || break
  sleep 0.1
done
grep -q '"kvs"' <<< "$listed" && fail "the dead engine is still in the directory"
echo "drill 2: $dead left the directory after its lease"

# 3. etcd frozen while requests flow: they complete on the engine the router knows.
kill -STOP "$etcd_pid"
for i in 1 2; do
  out="$(python3 "$client" "http://127.0.0.1:$router_port/v1/chat/completions" "$body")"
  [[ "$(content <<< "$out")" == "$ref_content" ]] || { kill -CONT "$etcd_pid"; fail "drill 3 request $i"; }
done
kill -CONT "$etcd_pid"
sleep 1
curl -sf "http://127.0.0.1:$alive_port/health" > /dev/null || fail "the survivor is down"
echo "drill 3: 2 requests completed with etcd stopped"

# 4. Drain the engine serving a stream; a third engine takes it over.
start e3 "${engine_args[@]}" --node-id e3
e3_pid=$last_pid e3_port=$last_port
if [[ $alive_port == "$e1_port" ]]; then alive_pid=$e1_pid; else alive_pid=$e2_pid; fi
sleep 1  # the router's watch sees e3 (an event, well under a second)
out="$(python3 "$client" "http://127.0.0.1:$router_port/v1/chat/completions" "$body" \
  --kill-after 20 --signal TERM --engines "$alive_port:$alive_pid,$e3_port:$e3_pid")"
python3 - "$out" "$ref_content" <<'PY' || fail "drill 4"
import json, sys
out, ref = json.loads(sys.argv[1]), sys.argv[2]
assert out["killed_pid"], "no engine was running the stream at chunk 20"
assert out["done"] and "error" not in out, out
assert out["content"] == ref, "content differs after the drain"
print(f"drill 4: drained pid {out['killed_pid']} after 20 chunks; next token "
      f"{out['resume_s']:.3f} s after SIGTERM; content == reference")
PY
drained="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["killed_pid"])' <<< "$out")"
wait "$drained" || fail "the drained engine exited with status $?"
grep -q "aborted the generation; failing over" "$work/router.err" ||
  fail "the drained engine finished the stream itself (the grace did not cut it)"
echo "drill 4: the drained engine handed the stream over at the end of its grace and exited 0"
kill -TERM "${pids[@]:1}" 2>/dev/null || true

# 5. One command for the whole cluster (disaggregated: a prefill and a decode engine).
cluster_up() {  # cluster_up NAME ARGS... : starts `cluster up`, sets up_pid and up_port
  local name="$1"
  shift
  "$bin" cluster up "$@" --port 0 --threads 1 --run-dir "$work/$name" > "$work/$name.out" 2>&1 &
  up_pid=$!
  pids+=("$up_pid")
  up_port=""
  for _ in $(seq 900); do
    up_port="$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/$name.out" 2>/dev/null || true)"
    [[ -n "$up_port" ]] && return 0
    kill -0 "$up_pid" 2>/dev/null || break
    sleep 0.2
  done
  fail "cluster up ($name) did not start"
}
# Its KV hand-over over UCX (--kv-transport ucx, issue 18); drills 6-9 use TCP.
cluster_up up --prefill 1 --decode 1 --kv-transport ucx
answer="$(curl -sf "http://127.0.0.1:$up_port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"dsinfer-default","messages":[{"role":"user","content":"Hi"}],"max_tokens":8}')" ||
  fail "cluster up: no answer"
grep -q '"finish_reason"' <<< "$answer" || fail "cluster up: bad answer $answer"
# A prompt of whole blocks goes prefill -> decode with its KV handed over.
up_prompt="$(python3 -c 'print(" ".join(["The cat sat on the mat."] * 60))')"
curl -sf "http://127.0.0.1:$up_port/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"dsinfer-default\",\"prompt\":\"$up_prompt\",\"max_tokens\":8}" > /dev/null ||
  fail "cluster up: no completion"
up_handoffs="$(curl -sf "http://127.0.0.1:$up_port/metrics" | sed -n 's/^dsinfer_router_kv_handoffs_total \([0-9]*\).*/\1/p')"
[[ "${up_handoffs:-0}" -ge 1 ]] || fail "cluster up: no KV hand-over ($up_handoffs)"
children="$(pgrep -P "$up_pid" | tr '\n' ' ')"
[[ $(wc -w <<< "$children") -eq 4 ]] || fail "cluster up: expected etcd + 2 engines + router, got: $children"
kill -INT "$up_pid"
wait "$up_pid" || fail "cluster up exited with status $?"
for c in $children; do kill -0 "$c" 2>/dev/null && fail "cluster up left process $c running"; done
echo "drill 5: cluster up --prefill 1 --decode 1 --kv-transport ucx answered through its router (KV hand-overs over UCX: $up_handoffs); Ctrl-C stopped its 4 processes"

# 6. Prefill and decode engines.
pd="etcd://127.0.0.1:$ecp/pd/"
pd_args=(serve --threads 1 --membership "$pd" --lease-ttl-s 3 --kv-store "file://$work/store")
start p1 "${pd_args[@]}" --role prefill --node-id p1
p1_port=$last_port p1_pid=$last_pid
start d1 "${pd_args[@]}" --role decode --node-id d1
d1_port=$last_port d1_pid=$last_pid
start pdrouter router --membership "$pd" --lease-ttl-s 3 --kv-store "file://$work/store"
pd_port=$last_port
long_prompt="$(python3 -c 'print(" ".join(["The cat sat on the mat and looked at the moon."] * 40))')"
pd_body="$(python3 -c 'import json,sys; print(json.dumps({"model":"dsinfer-default","messages":[{"role":"user","content":sys.argv[1]}],"max_tokens":40,"temperature":0.8,"seed":7,"ignore_eos":True,"stream":True,"stream_options":{"include_usage":True}}))' "$long_prompt")"
start ref serve --threads 1  # a plain engine for the reference stream
ref_port=$last_port
pd_ref="$(python3 "$client" "http://127.0.0.1:$ref_port/v1/chat/completions" "$pd_body" | content)"
pd_out="$(python3 "$client" "http://127.0.0.1:$pd_port/v1/chat/completions" "$pd_body")"
[[ "$(content <<< "$pd_out")" == "$pd_ref" ]] || fail "drill 6: the disaggregated stream differs"
metric() {  # metric PORT NAME
  curl -sf "http://127.0.0.1:$1/metrics" | sed -n "s/^$2 \([0-9.e+]*\)$/\1/p" | cut -d. -f1
}
p1_out="$(metric "$p1_port" dsinfer_engine_output_tokens_total)"
handoffs="$(metric "$pd_port" dsinfer_router_kv_handoffs_total)"
sent="$(metric "$p1_port" dsinfer_kv_handoff_blocks_sent_total)"
# Received into the decode engine's pool (full blocks and the prompt's tail rows); its
# continuation starts past the whole prompt: it computes only the first output token.
landed="$(metric "$d1_port" dsinfer_kv_inbox_landed_blocks_total)"
tail_rows="$(metric "$d1_port" dsinfer_kv_inbox_landed_tail_tokens_total)"
d1_hits="$(metric "$d1_port" dsinfer_prefix_hit_tokens_total)"
d1_prompt="$(metric "$d1_port" dsinfer_engine_prompt_tokens_total)"
[[ "$p1_out" -eq 1 ]] || fail "drill 6: the prefill engine sampled $p1_out tokens (want the first only)"
[[ "$handoffs" -eq 1 ]] || fail "drill 6: the router saw $handoffs KV hand-overs (want 1)"
[[ "$sent" -ge 3 && "$landed" -eq "$sent" ]] \
  || fail "drill 6: the prefill engine sent $sent blocks, the decode engine's pool took $landed"
[[ "$d1_hits" -eq $((sent * 128 + tail_rows)) && "$d1_prompt" -eq $((d1_hits + 1)) ]] \
  || fail "drill 6: the decode engine took $d1_hits of $d1_prompt tokens (want $((sent * 128 + tail_rows)) of $((sent * 128 + tail_rows + 1)))"
# The same prompt again: the router's prefix check (S-KV-4) finds it in the store and
# sends it straight to the decode engine.
pd_out="$(python3 "$client" "http://127.0.0.1:$pd_port/v1/chat/completions" "$pd_body")"
[[ "$(content <<< "$pd_out")" == "$pd_ref" ]] || fail "drill 6: the second stream differs"
direct="$(metric "$pd_port" dsinfer_router_direct_decode_total)"
[[ "$direct" -ge 1 ]] || fail "drill 6: the router's prefix check did not skip prefill on a stored prompt"
echo "drill 6: prefill -> decode stream == reference; prefill sampled $p1_out token, handed $sent blocks + $tail_rows tail rows into the decode engine's pool, decode took $d1_hits of $d1_prompt tokens from them; the repeat skipped prefill (prefix check)"
# 6b. The same with expert parallelism on both sides (issue 19): a `--ep 2` prefill engine
#     (its front relays rank's export) hands over to a `--ep 2 --ep-front off` decode engine,
#     whose rank 0 lands it in its pool and whose front is told the blocks' keys, so the
#     continuation goes to rank 0 by prefix. No shared store: the router must prefill.
epd="etcd://127.0.0.1:$ecp/pdep/"
epd_args=(serve --threads 1 --membership "$epd" --lease-ttl-s 3 --ep 2)
start pe "${epd_args[@]}" --role prefill --node-id pe
pe_pid=$last_pid
start de "${epd_args[@]}" --role decode --node-id de --ep-front off --ep-attention dp
de_port=$last_port de_pid=$last_pid
start eprouter router --membership "$epd" --lease-ttl-s 3
ep_out="$(python3 "$client" "http://127.0.0.1:$last_port/v1/chat/completions" "$pd_body")"
[[ "$(content <<< "$ep_out")" == "$pd_ref" ]] || fail "drill 6b: the --ep disaggregated stream differs"
ep_landed="$(metric "$de_port" dsinfer_kv_inbox_landed_blocks_total)"
ep_tail="$(metric "$de_port" dsinfer_kv_inbox_landed_tail_tokens_total)"
ep_hits="$(metric "$de_port" dsinfer_prefix_hit_tokens_total)"
ep_routed="$(metric "$de_port" dsinfer_dp_prefix_routed_total)"
[[ "$ep_landed" -ge 3 && "$ep_hits" -eq $((ep_landed * 128 + ep_tail)) && "$ep_routed" -eq 1 ]] ||
  fail "drill 6b: landed $ep_landed blocks + $ep_tail rows, $ep_hits hit tokens, $ep_routed routed by prefix"
kill -9 "$pe_pid" "$de_pid" "$last_pid"
echo "drill 6b: --ep 2 prefill -> --ep 2 decode stream == reference; $ep_landed blocks + $ep_tail tail rows landed in rank 0's pool, $ep_hits prompt tokens reused, the continuation routed to rank 0 by prefix"
# 7. Faults in the disaggregated cluster (a second prefill and decode engine join):
#    kill -9 the decode engine serving a stream, then the prefill engine running a
#    request's prefill; each stream equals the reference and the survivors hold no KV
#    block once idle.
start p2 "${pd_args[@]}" --role prefill --node-id p2
p2_port=$last_port p2_pid=$last_pid
start d2 "${pd_args[@]}" --role decode --node-id d2
d2_port=$last_port d2_pid=$last_pid
for _ in $(seq 50); do
  [[ "$(metric "$pd_port" dsinfer_router_engines)" == 4 ]] && break  # p1 p2 d1 d2 routable
  sleep 0.1
done
f_prompt="$(python3 -c 'print(" ".join(["A dog ran along the river bank at dawn."] * 45))')"
f_body="$(python3 -c 'import json,sys; print(json.dumps({"model":"dsinfer-default","messages":[{"role":"user","content":sys.argv[1]}],"max_tokens":60,"temperature":0.8,"seed":9,"ignore_eos":True,"stream":True}))' "$f_prompt")"
f_ref="$(python3 "$client" "http://127.0.0.1:$ref_port/v1/chat/completions" "$f_body" | content)"
no_leaks() {  # no_leaks PORT... : every engine holds no KV block once idle
  for port in "$@"; do
    local used=""
    for _ in $(seq 50); do
      used="$(metric "$port" dsinfer_kv_blocks_used)"
      [[ "$used" == 0 ]] && break
      sleep 0.1
    done
    [[ "$used" == 0 ]] || fail "drill 7: engine on port $port holds $used KV blocks when idle"
  done
}
out="$(python3 "$client" "http://127.0.0.1:$pd_port/v1/chat/completions" "$f_body" \
  --kill-after 15 --engines "$d1_port:$d1_pid,$d2_port:$d2_pid")"
python3 - "$out" "$f_ref" <<'PY' || fail "drill 7 (decode killed)"
import json, sys
out, ref = json.loads(sys.argv[1]), sys.argv[2]
assert out["killed_pid"], "no decode engine was running the stream at chunk 15"
assert out["done"] and "error" not in out, out
assert out["content"] == ref, "content differs from the reference"
PY
killed="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["killed_pid"])' <<< "$out")"
survivor_d=$d2_port; [[ "$killed" == "$d2_pid" ]] && survivor_d=$d1_port
no_leaks "$p1_port" "$p2_port" "$survivor_d"
echo "drill 7: decode engine $killed killed after 15 chunks; the stream continued unchanged; no KV block left on the survivors"
# The prefill engine running a request's prefill, killed: the request is prefilled again
# on the other prefill engine. A new, longer prompt (the store holds the last one, which
# the router's prefix check would send straight to a decode engine).
f_prompt="$(python3 -c 'print(" ".join(["A bird sang in the old oak tree by the gate."] * 150))')"
f_body="$(python3 -c 'import json,sys; print(json.dumps({"model":"dsinfer-default","messages":[{"role":"user","content":sys.argv[1]}],"max_tokens":30,"temperature":0.8,"seed":10,"ignore_eos":True,"stream":True}))' "$f_prompt")"
f_ref="$(python3 "$client" "http://127.0.0.1:$ref_port/v1/chat/completions" "$f_body" | content)"
python3 "$client" "http://127.0.0.1:$pd_port/v1/chat/completions" "$f_body" > "$work/f2.json" &
f2=$!
victim=""
for _ in $(seq 500); do
  for pp in "$p1_port:$p1_pid" "$p2_port:$p2_pid"; do
    if [[ "$(metric "${pp%%:*}" dsinfer_requests_running)" == 1 ]]; then victim="$pp"; break 2; fi
  done
  sleep 0.01
done
[[ -n "$victim" ]] || fail "drill 7: no prefill engine was seen running the request"
kill -9 "${victim##*:}" || fail "drill 7: prefill engine ${victim##*:} had exited before the kill"
wait "$f2" || fail "drill 7: the client failed after the prefill engine died"
python3 - "$(cat "$work/f2.json")" "$f_ref" <<'PY' || fail "drill 7 (prefill killed)"
import json, sys
out, ref = json.loads(sys.argv[1]), sys.argv[2]
assert out["done"] and "error" not in out, out
assert out["content"] == ref, "content differs from the reference"
PY
survivor_p=$p1_port; [[ "${victim%%:*}" == "$p1_port" ]] && survivor_p=$p2_port
no_leaks "$survivor_p" "$survivor_d"
echo "drill 7: prefill engine ${victim##*:} killed mid-request; the request completed unchanged; no KV block left on the survivors"
# 8. `cluster up --autoscale`: the autoscaler policy starts a second decode engine while
#    three streams keep the first one busy, and drains it once the load is gone.
cluster_up as --prefill 1 --decode 1 --autoscale --max-prefill 1 --max-decode 2 \
  --decode-requests 1 --scale-out-interval-s 1 --scale-in-interval-s 3 --autoscale-period-ms 300
as_pid=$up_pid as_port=$up_port
as_body='{"model":"dsinfer-default","prompt":"Once upon a time","max_tokens":400,"temperature":0.8,"seed":3,"ignore_eos":true}'
for k in 1 2 3; do
  curl -sf "http://127.0.0.1:$as_port/v1/completions" -H 'Content-Type: application/json' -d "$as_body" > "$work/as$k.json" &
  as_clients+=($!)
done
for _ in $(seq 300); do grep -q "decode-1 on" "$work/as.out" && break; sleep 0.1; done
grep -q "decode-1 on" "$work/as.out" || fail "drill 8: the autoscaler did not start a second decode engine"
for c in "${as_clients[@]}"; do wait "$c" || fail "drill 8: a request failed"; done
for _ in $(seq 300); do grep -q "decode-1 exited (status 0) after its drain" "$work/as.out" && break; sleep 0.1; done
grep -q "decode-1 exited (status 0) after its drain" "$work/as.out" ||
  fail "drill 8: the second decode engine was not drained once idle"
kill -INT "$as_pid"
wait "$as_pid" || fail "cluster up --autoscale exited with status $?"
echo "drill 8: the autoscaler started decode-1 under load and drained it when idle ($(grep -c 'autoscaler:' "$work/as.out") decisions)"
# 9. V4 (tiny-v4): `cluster up --prefill 1 --decode 1` hands over the blocks of every cache
#    group and the prefill's SWA state; the decode engine continues from that state (an
#    exact SWA hit, nothing replayed) and the stream equals a single engine's.
"$bin" make-model --preset tiny-v4 --format hf --out "$work/tiny-v4" > "$work/v4model.out" 2>&1 ||
  fail "drill 9: make-model --preset tiny-v4"
start v4ref serve --threads 1 --model "$work/tiny-v4"
v4ref_port=$last_port
cluster_up v4 --prefill 1 --decode 1 --model "$work/tiny-v4"
v4_pid=$up_pid v4_port=$up_port
v4_prompt="$(python3 -c 'print(" ".join(["The cat sat on the mat and looked at the moon."] * 30))')"
v4_body="$(python3 -c 'import json,sys; print(json.dumps({"model":"tiny-v4","messages":[{"role":"user","content":sys.argv[1]}],"max_tokens":30,"temperature":0.8,"seed":9,"ignore_eos":True,"stream":True}))' "$v4_prompt")"
v4_ref="$(python3 "$client" "http://127.0.0.1:$v4ref_port/v1/chat/completions" "$v4_body" | content)"
[[ -n "$v4_ref" ]] || fail "drill 9: the tiny-v4 engine gave no content"
v4_out="$(python3 "$client" "http://127.0.0.1:$v4_port/v1/chat/completions" "$v4_body" | content)"
[[ "$v4_out" == "$v4_ref" ]] || fail "drill 9: the V4 disaggregated stream differs from one engine's"
v4_d_port="$(sed -n 's|.*decode-0 on 127.0.0.1:\([0-9]*\).*|\1|p' "$work/v4.out")"
v4_handoffs="$(metric "$v4_port" dsinfer_router_kv_handoffs_total)"
v4_states="$(metric "$v4_d_port" dsinfer_kv_inbox_swa_states_total)"
v4_exact="$(metric "$v4_d_port" 'dsinfer_swa_exact_hits_total{traffic_class="chatbot"}')"
v4_replays="$(metric "$v4_d_port" 'dsinfer_swa_replays_total{traffic_class="chatbot"}')"
[[ "${v4_handoffs:-0}" -eq 1 && "${v4_states:-0}" -eq 1 ]] ||
  fail "drill 9: hand-overs $v4_handoffs, states stored $v4_states (want 1, 1)"
[[ "${v4_exact:-0}" -eq 1 && "${v4_replays:-1}" -eq 0 ]] ||
  fail "drill 9: exact SWA hits $v4_exact, replays $v4_replays (want 1, 0)"
kill -INT "$v4_pid"
wait "$v4_pid" || fail "cluster up (tiny-v4) exited with status $?"
echo "drill 9: tiny-v4 prefill -> decode: blocks and the SWA state handed over, one exact SWA hit, no replay; stream == one engine's"
echo "PASS"
