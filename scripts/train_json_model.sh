#!/usr/bin/env bash
# Reproduces model/bundled/shakespeare_json.pt: a byte-level model of the
# bundled model's shape and settings (scripts/train_bundled_model.sh) trained
# on tinyshakespeare's speeches written half as the play writes them and half
# as JSON (scripts/make_json_corpus.py), so that it can write the JSON that
# response_format asks for (docs/API_GENERATION.md, "Constrained output:
# JSON"). 25 minutes of wall time with 2 threads on the 2-core reference
# machine (figures: README.md, "Training and the bundled model").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
CORPUS="$BUILD_DIR/shakespeare_json_corpus.txt"
/usr/bin/python3 scripts/make_json_corpus.py data/tinyshakespeare.txt > "$CORPUS"
# The later flag wins: byte level, 25 minutes.
CORPUS="$CORPUS" OUT=${OUT:-model/bundled/shakespeare_json.pt} \
  scripts/train_bundled_model.sh --tokenizer byte --time_budget 1500 "$@"
