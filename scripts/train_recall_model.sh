#!/usr/bin/env bash
# Reproduces tests/fixtures/recall.pt: a small model (3 layers, d_model 96,
# 365k parameters, 1.5 MB) trained on the synthetic recall corpus
# (scripts/make_recall_corpus.py). It answers every held-out query of
# tests/integration/test_recall.py from memory (1.000; chance is 0.1), 0.10
# with the pairs cleared and 0.18 with a 40-key window.
#
# Takes 15-17 minutes with THREADS=1 on a 2-core machine (6000 steps, about
# 13k tokens/s, the other core busy). The fixture was trained with THREADS=1;
# other thread counts change the rounding, and with it the run.
#
# What it takes to learn to bind each key to its value (an induction circuit)
# rather than only recalling which values were stated (that stalls at about
# 0.66: 1/3, 1/2 and 1 for the three queries):
#  - tgt_len 128, longer than an example (at most 64 characters with 3 pairs,
#    94 with 8), so the gradient reaches the pairs: TXL memory is detached, and
#    with tgt_len 32 the pairs were only ever in memory. --same_length with
#    mem_len 96 trains exactly the serving window that the test evaluates
#    (each position sees the last 96 keys).
#  - 8-pair examples mixed in with the 3-pair ones: there, recalling the values
#    without their keys pays far less.
#  - 3 layers, d_model 96, d_inner 384: with the same data, 2 layers of
#    d_model 64, and 3 layers with d_inner 192 (to step 5500), stayed at 0.66;
#    this one binds abruptly, between steps 3000 and 4500 (valid bpc 0.47
#    -> 0.45).
#  - Pre-norm: post-norm models of this size did not learn to recall at all.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
OUT=${OUT:-tests/fixtures/recall.pt}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 scripts/make_recall_corpus.py --examples 30000 --seed 1 --out "$work/train.txt"
/usr/bin/python3 scripts/make_recall_corpus.py --examples 15000 --pairs 8 --seed 3 --out "$work/train8.txt"
/usr/bin/python3 scripts/make_recall_corpus.py --examples 400 --seed 2 --out "$work/valid.txt"
mkdir -p "$(dirname "$OUT")"
"$BUILD_DIR/tools/txl-train" --train "$work/train.txt,$work/train8.txt" --valid "$work/valid.txt" --tokenizer char \
  --n_layer 3 --n_head 6 --d_model 96 --d_head 16 --d_inner 384 --dropout 0 --pre_lnorm=true \
  --tgt_len 128 --mem_len 96 --same_length --batch_size 16 --lr 2e-3 --warmup 200 --max_steps 6000 \
  --eval_interval 1000 --checkpoint_interval 0 --eval_mem_len 96 \
  --eval_tgt_len 32 --log_interval 250 --threads "${THREADS:-1}" --seed 1 --out "$OUT" "$@"
rm -f "$OUT.trainstate"
