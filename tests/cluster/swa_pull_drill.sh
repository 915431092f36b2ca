#!/usr/bin/env bash
# The SWA-state directory and a remote SWA-state pull between real processes (issue 18,
# SPEC S-KV-8..10), on tiny-v4 (`make-model --preset tiny-v4`): etcd, a shared file KV
# store, the router and two `serve --role both` engines.
#   1. request A runs on engine-b (the only engine then): its prefill stores its SWA
#      state at 256 in engine-b's pool, and engine-b announces it to the router's
#      directory (dsinfer_router_swa_directory_states);
#   2. engine-a joins; request B shares A's first 256+ tokens and goes to engine-a (the
#      LB's tie goes to the first id): the router plans the hit (a state at L1 = 256 on
#      engine-b -> hit 256) and tells engine-a to pull it; engine-a pulls it
#      (dsinfer_swa_state_pulls_total 1), starts from it (one exact SWA hit, no replay),
#      and B's answer equals a single `serve`'s (greedy).
#   3. a second router joins (the directory's keys are split over the two by rendezvous
#      hashing); request C extends B and goes through each router in turn: each plans a
#      state hit (B's state is held by engine-a), the router that does not own a key it
#      needs asks the one that does (dsinfer_router_swa_remote_lookups_total >= 1 over
#      the two, none failed), and both answers equal a single `serve`'s.
# Usage: swa_pull_drill.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
source "$(dirname "$0")/lib.sh"
membership="etcd://127.0.0.1:$ecp/swa/"
metric() {  # metric PORT NAME
  curl -sf "http://127.0.0.1:$1/metrics" | sed -n "s/^$2 \([0-9.e+]*\)$/\1/p" | cut -d. -f1
}
ask() {  # ask PORT CONTENT MAX_TOKENS -> the JSON reply
  local body
  body="$(python3 -c 'import json,sys; print(json.dumps({"model":"tiny-v4","messages":[{"role":"user","content":sys.argv[1]}],"max_tokens":int(sys.argv[2]),"temperature":0}))' "$2" "$3")"
  curl -sf "http://127.0.0.1:$1/v1/chat/completions" -H 'Content-Type: application/json' -d "$body"
}
field() { python3 -c 'import json,sys; j=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

"$bin" make-model --preset tiny-v4 --format hf --out "$work/tiny-v4" > "$work/model.out" 2>&1 ||
  fail "make-model --preset tiny-v4"
model=(--model "$work/tiny-v4" --threads 1)
store=(--kv-store "file://$work/kv")
start ref serve "${model[@]}"
ref_port=$last_port
start engine-b serve "${model[@]}" "${store[@]}" --role both --membership "$membership" --node-id engine-b
b_port=$last_port
start router router "${model[@]}" "${store[@]}" --membership "$membership"
router_port=$last_port

shared="$(python3 -c 'print(" ".join(["The cat sat on the mat and looked at the moon."] * 25))')"
prompt_a="$shared Why?"
prompt_b="$shared $(python3 -c 'print(" ".join(["Then the dog ran across the field to the old barn."] * 16))')"
# 1. A on engine-b; its state reaches the router's directory.
a="$(ask "$router_port" "$prompt_a" 4)" || fail "request A"
echo "request A: $(field 'j["usage"]["prompt_tokens"]' <<< "$a") prompt tokens"
for _ in $(seq 100); do
  [[ "$(metric "$router_port" dsinfer_router_swa_directory_states)" -ge 1 ]] && break
  sleep 0.1
done
states="$(metric "$router_port" dsinfer_router_swa_directory_states)"
[[ "${states:-0}" -ge 1 ]] || fail "drill 1: the router's directory holds $states SWA states"
echo "drill 1: engine-b's SWA state is in the router's directory ($states states)"

# 2. engine-a joins; B goes there and pulls the state from engine-b.
start engine-a serve "${model[@]}" "${store[@]}" --role both --membership "$membership" --node-id engine-a
a_port=$last_port
for _ in $(seq 100); do
  [[ "$(metric "$router_port" dsinfer_router_engines)" -eq 2 ]] && break
  sleep 0.1
done
want="$(ask "$ref_port" "$prompt_b" 12 | field 'j["choices"][0]["message"]["content"]')" ||
  fail "request B on the reference"
b="$(ask "$router_port" "$prompt_b" 12)" || fail "request B through the router"
got="$(field 'j["choices"][0]["message"]["content"]' <<< "$b")"
echo "request B: $(field 'j["usage"]["prompt_tokens"]' <<< "$b") prompt tokens"
pulls="$(metric "$a_port" dsinfer_swa_state_pulls_total)"
exact="$(metric "$a_port" 'dsinfer_swa_exact_hits_total{traffic_class="chatbot"}')"
replays="$(metric "$a_port" 'dsinfer_swa_replays_total{traffic_class="chatbot"}')"
hints="$(metric "$router_port" dsinfer_router_swa_pull_hints_total)"
hits="$(metric "$router_port" dsinfer_router_swa_state_hits_total)"
[[ "${hints:-0}" -eq 1 && "${hits:-0}" -eq 1 ]] ||
  fail "drill 2: router pull hints $hints, state hits $hits (want 1, 1)"
[[ "${pulls:-0}" -eq 1 ]] || fail "drill 2: engine-a pulled $pulls SWA states (want 1)"
[[ "${exact:-0}" -eq 1 && "${replays:-1}" -eq 0 ]] ||
  fail "drill 2: engine-a's exact SWA hits $exact, replays $replays (want 1, 0)"
[[ -n "$want" && "$got" == "$want" ]] || fail "drill 2: B's answer differs from one engine's"
pull_us="$(metric "$a_port" dsinfer_swa_state_pull_microseconds_total)"
pull_bytes="$(metric "$a_port" dsinfer_swa_state_pull_bytes_total)"
echo "drill 2: engine-a pulled engine-b's SWA state ($pull_bytes bytes in $pull_us us), one exact SWA hit, no replay; answer == one engine's"

# 3. A second router; C (B + more) through each router: state hits planned on both, the
#    keys the other router owns asked for there.
start router-2 router "${model[@]}" "${store[@]}" --membership "$membership"
router2_port=$last_port
for _ in $(seq 100); do
  [[ "$(metric "$router_port" dsinfer_router_swa_routers)" -eq 2 &&
     "$(metric "$router2_port" dsinfer_router_swa_routers)" -eq 2 &&
     "$(metric "$router2_port" dsinfer_router_engines)" -eq 2 ]] && break
  sleep 0.1
done
[[ "$(metric "$router2_port" dsinfer_router_swa_routers)" -eq 2 ]] ||
  fail "drill 3: the routers do not see each other"
sleep 1  # each router's poll of the engines (every 200 ms) keeps the keys it now owns
prompt_c="$prompt_b And then it rained."
want_c="$(ask "$ref_port" "$prompt_c" 12 | field 'j["choices"][0]["message"]["content"]')" ||
  fail "request C on the reference"
lookups=0
for port in "$router_port" "$router2_port"; do
  before="$(metric "$port" dsinfer_router_swa_state_hits_total)"
  c="$(ask "$port" "$prompt_c" 12)" || fail "drill 3: request C through the router on $port"
  [[ "$(field 'j["choices"][0]["message"]["content"]' <<< "$c")" == "$want_c" ]] ||
    fail "drill 3: C's answer through the router on $port differs from one engine's"
  after="$(metric "$port" dsinfer_router_swa_state_hits_total)"
  [[ "$after" -eq $((before + 1)) ]] ||
    fail "drill 3: the router on $port planned no SWA state hit for C ($before -> $after)"
  lookups=$((lookups + $(metric "$port" dsinfer_router_swa_remote_lookups_total)))
  failed="$(metric "$port" dsinfer_router_swa_remote_lookup_failures_total)"
  [[ "${failed:-1}" -eq 0 ]] || fail "drill 3: $failed lookups at the other router failed"
done
[[ "$lookups" -ge 1 ]] || fail "drill 3: no router asked the other for a key it does not own"
echo "drill 3: two routers; C planned as an SWA state hit through each ($lookups lookups at the owning router); answers == one engine's"
echo "PASS"
