#!/usr/bin/env bash
# The whole pipeline on the GPU machine: corpus -> train -> export -> model card.
#   tools/train/run_all.sh OUTDIR
# Env: TOTAL_MINUTES (default 14: the whole run, corpus and export included; use 9.3 under a
#      10-minute command limit), TRAIN_MINUTES (caps the training loop, default 13),
#      TOKENIZER_DIR (default .models/qwen3-tokenizer), PRESET (small), EXTRA_TRAIN_ARGS,
#      CORPUS_MAX_BYTES (default 200 MiB).
# Writes OUTDIR/{corpus/, train/, hf/, check/, MODEL_CARD.md, run.log}. A corpus already in
# OUTDIR/corpus (manifest.json present) is reused.
set -euo pipefail
OUT=${1:?usage: tools/train/run_all.sh OUTDIR}
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
START=$(date +%s)
TOTAL_MINUTES=${TOTAL_MINUTES:-14}
TRAIN_MINUTES=${TRAIN_MINUTES:-13}
TOK=${TOKENIZER_DIR:-.models/qwen3-tokenizer}
PRESET=${PRESET:-small}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
[ -s "$TOK/tokenizer.json" ] || { echo "run_all: no $TOK/tokenizer.json (scripts/fetch-tokenizer.sh; carry .models/qwen3-tokenizer)"; exit 1; }
python3 -c 'import torch, transformers, tokenizers, safetensors; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "cuda", torch.cuda.is_available())'

if [ -s "$OUT/corpus/manifest.json" ] && [ -s "$OUT/corpus/train.bin" ]; then
  echo "run_all: reusing $OUT/corpus"
else
  python3 tools/train/build_corpus.py --tokenizer "$TOK/tokenizer.json" --out "$OUT/corpus" \
    --max-bytes "${CORPUS_MAX_BYTES:-209715200}"
fi

# Training budget: what is left of TOTAL_MINUTES after the corpus, less 1.5 min for startup,
# the final evaluation and the export; at most TRAIN_MINUTES.
BUDGET=$(python3 -c "import time; left = $TOTAL_MINUTES - (time.time() - $START) / 60 - 1.5; print(round(max(0.5, min($TRAIN_MINUTES, left)), 2))")
echo "run_all: training budget $BUDGET min"
# shellcheck disable=SC2086
python3 tools/train/train.py --data "$OUT/corpus" --out "$OUT/train" --preset "$PRESET" \
  --budget-minutes "$BUDGET" ${EXTRA_TRAIN_ARGS:-}

python3 tools/train/export.py --ckpt "$OUT/train/checkpoint.pt" --out "$OUT/hf" --tokenizer-dir "$TOK" \
  --corpus "$OUT/corpus" --metrics "$OUT/train/metrics.json" --card "$OUT/MODEL_CARD.md" --check "$OUT/check"
cp "$OUT/MODEL_CARD.md" "$OUT/hf/README.md"
echo "run_all: done in $(( $(date +%s) - START )) s; see $OUT/MODEL_CARD.md"
