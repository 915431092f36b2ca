#!/usr/bin/env bash
# `dsinfer` as a user runs it (issue 14), real processes on loopback:
#   1. `cmake --install` into a fresh prefix; the installed `dsinfer serve`, started from /
#      with an empty cache directory, creates the embedded default model from its
#      installed data and answers a chat completion; as a new user tries it: a question
#      gets an English answer, a tools list a parsed tool call, response_format JSON;
#   2. `serve --kv-store file://DIR`: a 1,500-token prompt, the server restarted, the same
#      prompt reports >= 1,024 cached prompt tokens in usage;
#   3. the same store blocks hit across commands: `generate` hits the blocks `serve`
#      wrote, and `serve` hits the blocks `generate` wrote (one model id rule);
#   4. bad flag values are refused with a message naming the flag;
#   5. speculative decoding (MTP, n-gram, MTP with variable-length verification) gives
#      the output without it;
#   6. a request with speculative_usage gets its drafted / accepted counts in usage
#      (Chat Completions, Messages); without it usage has none; a bad value is a 400.
# Usage: serving_cli_test.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/dsi_serving_cli_XXXXXX")"
server_pid=""
cleanup() {
  [[ -n "$server_pid" ]] && kill -9 "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Every run sees only this test's home (empty cache) and none of the caller's settings.
unset XDG_CACHE_HOME $(env | sed -n 's/^\(DSINFER_[A-Z_]*\)=.*/\1/p')
export HOME="$work/home"
mkdir -p "$HOME"

cmake --install "$build" --prefix "$work/prefix" > "$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install"; }
bin="$work/prefix/bin/dsinfer"
[[ -x "$bin" ]] || fail "no installed binary"
[[ -f "$work/prefix/share/dsinfer/tokenizer/deepseek_v3/tokenizer.json" ]] ||
  fail "no installed tokenizer data"

port=""
start_server() {  # start_server NAME ARGS...: from /, sets server_pid and port
  local name="$1"
  shift
  (cd / && exec "$bin" serve --port 0 --threads 1 "$@") > "$work/$name.out" 2> "$work/$name.err" &
  server_pid=$!
  port=""
  for _ in $(seq 600); do
    port="$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/$name.out" 2>/dev/null || true)"
    [[ -n "$port" ]] && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.2
  done
  cat "$work/$name.out" "$work/$name.err" >&2
  fail "$name did not start"
}
stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid" || fail "serve exit status after SIGTERM"
  server_pid=""
}
post() {  # post PATH JSON -> response body on stdout
  curl -sS --max-time 300 "http://127.0.0.1:$port$1" -H 'Content-Type: application/json' -d "$2"
}
cached_tokens() { sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p'; }
prompt_tokens() { sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p'; }

# 1. Installed, from /, empty cache: the default model is created and answers.
start_server first
# The embedded default is the trained model pack, unpacked under a name with its hash.
compgen -G "$HOME/.cache/dsinfer/models/dsinfer-default-*/model.safetensors" > /dev/null ||
  fail "default model not created: $(find "$HOME/.cache" -maxdepth 4 | tr '\n' ' ')"
r="$(post /v1/chat/completions \
  '{"model":"dsinfer-default","messages":[{"role":"user","content":"Hi"}],"max_tokens":4}')"
[[ "$r" == *'"object":"chat.completion"'* ]] || fail "no chat completion: $r"
# As a new user tries the trained default (issue 17), greedy: a question gets an English
# answer, a tools list a parsed tool call, response_format valid JSON.
r="$(post /v1/chat/completions '{"model":"dsinfer-default","messages":[{"role":"user",
  "content":"Tell me a short story about a cat."}],"max_tokens":80,"temperature":0}')"
python3 - "$r" <<'PY' || fail "no English answer: $r"
import json, re, sys
text = json.loads(sys.argv[1])["choices"][0]["message"]["content"]
assert text.isascii() and len(re.findall(r"[A-Za-z]+", text)) >= 5, text
PY
r="$(post /v1/chat/completions '{"model":"dsinfer-default","messages":[{"role":"user",
  "content":"What is the weather in Paris?"}],"tools":[{"type":"function","function":{
  "name":"get_weather","description":"Get the current weather in a city.","parameters":{
  "type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],
  "max_tokens":160,"temperature":0}')"
python3 - "$r" <<'PY' || fail "no parsed tool call: $r"
import json, sys
choice = json.loads(sys.argv[1])["choices"][0]
assert choice["finish_reason"] == "tool_calls", choice
call = choice["message"]["tool_calls"][0]["function"]
assert call["name"] == "get_weather" and isinstance(json.loads(call["arguments"])["city"], str), call
PY
r="$(post /v1/chat/completions '{"model":"dsinfer-default","messages":[{"role":"user",
  "content":"Extract the person from this text as JSON: Anna is 31 years old and lives in Paris."}],
  "response_format":{"type":"json_schema","json_schema":{"name":"person","schema":{"type":"object",
  "properties":{"name":{"type":"string"},"age":{"type":"integer"},"city":{"type":"string"}},
  "required":["name","age","city"]}}},"max_tokens":160,"temperature":0}')"
python3 - "$r" <<'PY' || fail "no valid JSON answer: $r"
import json, sys
choice = json.loads(sys.argv[1])["choices"][0]
v = json.loads(choice["message"]["content"])
assert choice["finish_reason"] == "stop", choice
assert isinstance(v["name"], str) and isinstance(v["age"], int) and isinstance(v["city"], str), v
PY
stop_server

# 2. A store, a 1,500-token prompt, a restart.
store="file://$work/store?fsync=0"
words() {  # words SEED: ~1,500 tokens of distinct text
  for i in $(seq 150); do printf 'item %d of list %s is %d; ' "$i" "$1" $((i * 7919 % 1000)); done
}
p1="$(words one)"
req1="$(printf '{"model":"dsinfer-default","prompt":"%s","max_tokens":2}' "$p1")"
start_server store1 --kv-store "$store"
r="$(post /v1/completions "$req1")"
n="$(prompt_tokens <<< "$r")"
[[ -n "$n" ]] && (( n >= 1500 )) || fail "prompt of $n tokens, wanted >= 1500: $r"
echo "prompt tokens: $n, first run cached: $(cached_tokens <<< "$r")"
stop_server  # drains the write-behind queue into the store
start_server store2 --kv-store "$store"
r="$(post /v1/completions "$req1")"
c="$(cached_tokens <<< "$r")"
[[ -n "$c" ]] && (( c >= 1024 )) || fail "after restart: cached $c, wanted >= 1024: $r"
echo "after restart: cached $c"

# 3. generate hits what serve wrote; serve hits what generate wrote.
gen() {  # gen NAME PROMPT
  (cd / && timeout 300 "$bin" generate --prompt "$2" --max-tokens 2 --threads 1 \
    --kv-store "$store") > "$work/$1.out" 2> "$work/$1.err" ||
    { cat "$work/$1.err" >&2; fail "generate $1"; }
}
gen gen1 "$p1"
hits="$(sed -n 's/.*kv store: [0-9]* lookups, \([0-9]*\) hit blocks.*/\1/p' "$work/gen1.err")"
[[ -n "$hits" ]] && (( hits >= 8 )) || { cat "$work/gen1.err" >&2; fail "generate hit $hits blocks"; }
echo "generate hit $hits blocks written by serve"
p2="$(words two)"
gen gen2 "$p2"
r="$(post /v1/completions "$(printf '{"model":"dsinfer-default","prompt":"%s","max_tokens":2}' "$p2")")"
c="$(cached_tokens <<< "$r")"
[[ -n "$c" ]] && (( c >= 1024 )) || fail "serve after generate: cached $c: $r"
echo "serve hit $c tokens written by generate"
stop_server

# 4. Bad flag values: refused, the flag named.
bad() {  # bad FLAG ARGS...
  local flag="$1"
  shift
  if (cd / && timeout 120 "$bin" "$@") > "$work/bad.out" 2>&1; then
    fail "accepted: $*"
  fi
  grep -q -- "$flag" "$work/bad.out" || fail "no mention of $flag: $(cat "$work/bad.out")"
}
bad --kv-cache-mb serve --kv-cache-mb -5
bad --kv-store serve --kv-store 'ftp://nowhere'
bad --kv-dtype generate --prompt x --kv-dtype f7
bad --swap-space-mb generate --prompt x --swap-space-mb -1
bad --model generate --prompt x --model "$work/missing"
bad --cost-model serve --cost-model "$work/missing.json"
bad --data-dir serve --cache-dir "$work/empty-cache" --data-dir "$work/nothing-here"
bad --speculative generate --prompt x --speculative eagle
bad --num-speculative-tokens generate --prompt x --speculative ngram --num-speculative-tokens 17
bad --num-speculative-tokens generate --prompt x --num-speculative-tokens 3
bad --enable-mtp-varlen generate --prompt x --enable-mtp-varlen
bad --spec-acceptance generate --prompt x --speculative mtp --spec-acceptance maybe
bad --spec-acceptance generate --prompt x --spec-acceptance rejection
bad --spec-draft-vocab generate --prompt x --speculative ngram --spec-draft-vocab "$work/v.json"
bad --spec-draft-vocab generate --prompt x --speculative mtp --spec-draft-vocab "$work/missing.json"
bad --verify-cost generate --prompt x --speculative mtp --enable-mtp-varlen --verify-cost "$work/missing.json"

# 5. Speculative decoding changes nothing in the output (exact acceptance, issue 24).
spec_gen() {  # spec_gen NAME ARGS...
  local name="$1"
  shift
  (cd / && timeout 300 "$bin" generate --prompt "$p1" --max-tokens 24 --threads 1 \
    --temperature 0.7 --seed 9 "$@") > "$work/$name.out" 2> "$work/$name.err" ||
    { cat "$work/$name.err" >&2; fail "generate $name"; }
}
spec_gen nospec
spec_gen mtp --speculative mtp --num-speculative-tokens 3
spec_gen ngram --speculative ngram
# DSpark variable-length verification: the verify-cost curve is profiled on first use
# and kept beside the model; MTP drafts from the default model's draft vocabulary.
spec_gen varlen --speculative mtp --num-speculative-tokens 4 --enable-mtp-varlen
cmp -s "$work/nospec.out" "$work/mtp.out" || fail "mtp output differs: $(cat "$work/mtp.out")"
cmp -s "$work/nospec.out" "$work/ngram.out" || fail "ngram output differs: $(cat "$work/ngram.out")"
cmp -s "$work/nospec.out" "$work/varlen.out" || fail "varlen output differs: $(cat "$work/varlen.out")"
ls "$HOME"/.cache/dsinfer/models/*/dsinfer_verify_cost.json > /dev/null 2>&1 ||
  fail "no verify-cost curve beside the default model: $(ls "$HOME"/.cache/dsinfer/models/*)"
ls "$HOME"/.cache/dsinfer/models/*/draft_vocab.json > /dev/null 2>&1 || fail "no draft vocabulary beside the default model"
grep -q "speculative" "$work/mtp.err" || fail "no speculative summary: $(cat "$work/mtp.err")"
echo "speculation: same output as without"

# 6. Per-request speculative counts in usage, when the request asks (speculative_usage).
start_server spec --speculative mtp --num-speculative-tokens 3
chat='"model":"dsinfer-default","messages":[{"role":"user","content":"Hi"}],"max_tokens":16,"ignore_eos":true'
for body in "{$chat,\"speculative_usage\":true}" \
  '{"model":"dsinfer-default","max_tokens":16,"messages":[{"role":"user","content":"Hi"}],"speculative_usage":true}'; do
  path=/v1/chat/completions
  [[ "$body" == *'"max_tokens":16,"messages"'* ]] && path=/v1/messages
  r="$(post "$path" "$body")"
  python3 -c '
import json, sys
u = json.loads(sys.argv[1])["usage"]["speculative"]
assert u["draft_tokens"] > 0 and 0 <= u["accepted_tokens"] <= u["draft_tokens"], u
assert 0 < u["verify_steps"] <= u["draft_tokens"], u
' "$r" || fail "speculative usage on $path: $r"
done
r="$(post /v1/chat/completions "{$chat}")"
[[ "$r" == *'"usage"'* && "$r" != *'"speculative"'* ]] || fail "speculative usage not asked for: $r"
r="$(post /v1/chat/completions "{$chat,\"speculative_usage\":\"yes\"}")"
[[ "$r" == *'speculative_usage: '* ]] || fail "bad speculative_usage accepted: $r"
stop_server
echo "speculative usage: on request"
echo "PASS"
