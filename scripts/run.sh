#!/usr/bin/env bash
# README command 1: install what is missing, build, run the main job.
# Until the server lands, the main job is an evaluation: a model over a
# slice of the Shakespeare corpus, fed in chunks through one session.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
CORPUS=${CORPUS:-../shared/data/tinyshakespeare.txt}
[ -f "$CORPUS" ] || { echo "run.sh: corpus $CORPUS not found (set CORPUS=...)" >&2; exit 1; }
MODEL=${MODEL:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$MODEL" ]; then
  # No trained model is bundled yet: evaluate a freshly initialised one.
  MODEL="$work/init.pt"
  printf '{"n_layer": 4, "n_head": 4, "d_model": 128, "d_head": 32, "d_inner": 512, "mem_len": 128}\n' > "$work/config.json"
  "$BUILD_DIR/model/txl-init" --config "$work/config.json" --tokenizer char --corpus "$CORPUS" --out "$MODEL"
fi
tail -c 20000 "$CORPUS" > "$work/valid.txt"
echo "== txl-eval $MODEL on the last 20000 characters, all at once and in chunks of 64"
"$BUILD_DIR/model/txl-eval" --model "$MODEL" --text "$work/valid.txt"
"$BUILD_DIR/model/txl-eval" --model "$MODEL" --text "$work/valid.txt" --chunk 64
