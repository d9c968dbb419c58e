#!/usr/bin/env bash
# Reproduces model/bundled/shakespeare_char.pt, the server's default model:
# a character-level Transformer-XL trained on tinyshakespeare for 30 minutes
# of wall time on the 2-core reference machine (figures: README.md, "Training and the bundled model").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
CORPUS=${CORPUS:-data/tinyshakespeare.txt}
OUT=${OUT:-model/bundled/shakespeare_char.pt}
"$BUILD_DIR/tools/txl-train" --train "$CORPUS" --valid_fraction 0.1 \
  --tokenizer char --n_layer 4 --n_head 4 --d_model 128 --d_head 32 --d_inner 512 --dropout 0 \
  --tgt_len 128 --mem_len 128 --batch_size 16 --lr 2e-3 --warmup 200 --max_steps 6400 \
  --time_budget 1800 --eval_interval 2000 --checkpoint_interval 500 --eval_mem_len 256 \
  --log_interval 100 --threads 2 --seed 1 --out "$OUT" "$@"
rm -f "$OUT.trainstate"
