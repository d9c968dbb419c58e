#!/usr/bin/env bash
# Issue 35, part 3: candidates for a better bundled character model, trained side by side on one
# GPU for the same wall time, each to the end of its own learning-rate schedule; keeps the one
# with the best validation bits per character (the last 10% of the corpus, read with the serving
# window) and refuses one over the size limit. docs/GPU.md, "Training the bundled model on a GPU".
#
#   scripts/train_gpu_model.sh [--seconds S] [--out DIR] [--txl_train BIN] [--corpus FILE]
#                              [--device cuda|cpu] [--dry-run]
#
# Each candidate first runs 60 steps to measure its speed beside the others, then trains for
# about --seconds (default 240) with max_steps set from that speed, so that its cosine schedule
# ends inside the time (--time_budget stops it at 1.2x if the speed was misjudged). Writes
# DIR/NAME.pt and DIR/NAME.log per candidate, DIR/best.pt and DIR/summary.json. Exit status 0
# when the best candidate was written and is within the size limit (20 MB).
# --dry-run: the same mechanics on the CPU with tiny shapes and a few steps (CTest runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=240
OUT=build/gpu-model
TRAIN=${BUILD_DIR:-build}/tools/txl-train
CORPUS=data/tinyshakespeare.txt
DEVICE=cuda
DRY=0
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) SECONDS_EACH=$2; shift ;;
    --out) OUT=$2; shift ;;
    --txl_train) TRAIN=$2; shift ;;
    --corpus) CORPUS=$2; shift ;;
    --device) DEVICE=$2; shift ;;
    --dry-run) DRY=1; DEVICE=cpu ;;
    *) echo "train_gpu_model.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$TRAIN" ] || { echo "train_gpu_model.sh: no txl-train at $TRAIN (--txl_train)" >&2; exit 2; }
[ -f "$CORPUS" ] || { echo "train_gpu_model.sh: no corpus at $CORPUS (--corpus)" >&2; exit 2; }
mkdir -p "$OUT"
LIMIT=20000000  # bytes: issue 35's 20 MB

# The candidates: about 4.4M parameters (17-18 MB as float32), regularised for a 1 MB corpus.
# The base model's post-norm layers; segments of 256 characters with 256 of memory, served with
# 512. Serving speed on the 2-core CPU is measured beside (docs/GPU.md).
declare -A CANDIDATES=(
  [l6d256_drop20]="--n_layer 6 --d_model 256 --n_head 8 --d_head 32 --d_inner 768 --dropout 0.2 --dropatt 0.1"
  [l6d256_drop30]="--n_layer 6 --d_model 256 --n_head 8 --d_head 32 --d_inner 768 --dropout 0.3 --dropatt 0.1"
  [l8d224_drop25]="--n_layer 8 --d_model 224 --n_head 7 --d_head 32 --d_inner 672 --dropout 0.25 --dropatt 0.1"
)
COMMON=(--train "$CORPUS" --valid_fraction 0.1 --tokenizer char --device "$DEVICE" --tgt_len 256 --mem_len 256
  --eval_mem_len 512 --eval_tgt_len 128 --batch_size 32 --lr 1e-3 --min_lr 1e-4 --warmup 200 --clip 0.25
  --seed 1 --eval_interval 0 --checkpoint_interval 0 --log_interval 100)
CALIBRATE=60
TAIL=()  # after a candidate's flags: later flags win
if [ "$DRY" = 1 ]; then
  # Tiny shapes and segments, a few steps, a short validation read.
  TAIL=(--n_layer 2 --d_model 32 --n_head 2 --d_head 16 --d_inner 64 --tgt_len 16 --mem_len 16 --batch_size 4
    --warmup 2 --eval_max_tokens 2000 --log_interval 5 --threads 1)
  CALIBRATE=10
  SECONDS_EACH=6
fi
TOKENS_PER_STEP=$(printf '%s\n' "${COMMON[@]}" "${TAIL[@]}" |
  awk '/^--tgt_len$/{getline; t=$0} /^--batch_size$/{getline; b=$0} END{print t*b}')

# 1. Speed, all candidates at once (as they will train).
pids=()
for name in "${!CANDIDATES[@]}"; do
  # shellcheck disable=SC2086  # the candidate's flags are words
  "$TRAIN" "${COMMON[@]}" ${CANDIDATES[$name]} "${TAIL[@]}" \
    --max_steps "$CALIBRATE" --log_interval "$CALIBRATE" --eval_max_tokens 1000 --out "$OUT/$name.calib.pt" \
    >"$OUT/$name.calib.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "train_gpu_model.sh: a calibration run failed:" >&2; tail -3 "$OUT"/*.calib.log >&2; exit 1; }; done

# 2. The runs, each to the end of a schedule sized to the time.
pids=()
for name in "${!CANDIDATES[@]}"; do
  tps=$(grep -o '[0-9]* tok/s' "$OUT/$name.calib.log" | tail -1 | cut -d' ' -f1)
  steps=$(awk -v s="$SECONDS_EACH" -v t="$tps" -v k="$TOKENS_PER_STEP" 'BEGIN{n=int(0.9*s*t/k); print (n<20?20:n)}')
  echo "train_gpu_model.sh: $name: $tps tokens/s beside the others, $steps steps of $TOKENS_PER_STEP tokens"
  rm -f "$OUT/$name.calib.pt" "$OUT/$name.calib.pt.trainstate"
  # shellcheck disable=SC2086
  "$TRAIN" "${COMMON[@]}" ${CANDIDATES[$name]} "${TAIL[@]}" \
    --max_steps "$steps" --time_budget "$(awk -v s="$SECONDS_EACH" 'BEGIN{print 1.2*s}')" \
    --out "$OUT/$name.pt" >"$OUT/$name.log" 2>&1 &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ $failed = 0 ] || { echo "train_gpu_model.sh: a run failed:" >&2; tail -3 "$OUT"/*.log >&2; exit 1; }

# 3. The best by validation bits per character with the serving window.
python3 - "$OUT" "$LIMIT" "${!CANDIDATES[@]}" <<'EOF'
import json, os, re, shutil, sys
out, limit, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = []
for name in names:
    log = open(os.path.join(out, name + ".log")).read()
    evals = re.findall(r"eval step (\d+) \| valid bpc ([0-9.]+) ppl [0-9.]+ \(mem_len (\d+)\) \| bpc ([0-9.]+) \(mem_len 0\)", log)
    if not evals:
        sys.exit("train_gpu_model.sh: %s logged no evaluation" % name)
    step, bpc, mem, bpc0 = evals[-1]
    speed = re.findall(r"([0-9]+) tok/s", log)
    path = os.path.join(out, name + ".pt")
    rows.append({"name": name, "steps": int(step), "valid_bpc": float(bpc), "valid_bpc_no_memory": float(bpc0),
                 "eval_mem_len": int(mem), "tokens_per_s": int(speed[-1]) if speed else None,
                 "bytes": os.path.getsize(path), "budget_stopped": "time budget" in log})
rows.sort(key=lambda r: r["valid_bpc"])
best = rows[0]
shutil.copyfile(os.path.join(out, best["name"] + ".pt"), os.path.join(out, "best.pt"))
json.dump({"candidates": rows, "best": best["name"], "size_limit_bytes": limit}, open(os.path.join(out, "summary.json"), "w"), indent=1)
for r in rows:
    print("train_gpu_model.sh: %-16s %6d steps  valid bpc %.4f (mem_len %d), %.4f without memory, %d bytes%s"
          % (r["name"], r["steps"], r["valid_bpc"], r["eval_mem_len"], r["valid_bpc_no_memory"], r["bytes"],
             ", stopped by the time budget" if r["budget_stopped"] else ""))
print("train_gpu_model.sh: best %s -> %s/best.pt" % (best["name"], out))
if best["bytes"] > limit:
    sys.exit("train_gpu_model.sh: best.pt is %d bytes, over the limit of %d" % (best["bytes"], limit))
EOF
