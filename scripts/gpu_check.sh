#!/usr/bin/env bash
# The GPU test matrix, for a machine with an NVIDIA GPU and a CUDA libtorch:
#   scripts/gpu_check.sh /path/to/libtorch [OUT_DIR]
# Steps (each prints PASS or FAIL; the exit status is the number that failed):
#   build-nccl    configure and build with TXL_NCCL=ON (skipped, and said so, without nccl.h)
#   build         configure and build with TXL_NCCL=OFF
#   unit          model_test and precision_test (they take cuda where a test asks for it)
#   eval          txl-eval log-probs, CPU vs CUDA, within 1e-4, whole input and chunked
#   servers       the server integration tests with every server on --device cuda
#                 (TXL_TEST_SERVER_FLAGS): sessions, rewind, offload and restore, durability
#   cross-device  a session exported from a CUDA server imports into a CPU server and back,
#                 and both continue with the same greedy tokens
#   train         tests/integration/test_train.py: CUDA vs CPU losses and resume
#   bench         engine_bench --device cuda: one session (P1) and 32 (P3)
# Not run in this repository's CI, which has no GPU; docs/PERFORMANCE.md says what has run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
LIBTORCH=${1:?usage: scripts/gpu_check.sh /path/to/cuda/libtorch [OUT_DIR]}
OUT=${2:-gpu-check}
mkdir -p "$OUT"
JOBS=${JOBS:-$(nproc)}
failed=0
step() {  # step NAME COMMAND...: runs it, logs to OUT/NAME.log
  local name=$1
  shift
  echo "gpu_check: $name ..."
  if "$@" >"$OUT/$name.log" 2>&1; then
    echo "gpu_check: $name PASS"
  else
    echo "gpu_check: $name FAIL (see $OUT/$name.log)"
    failed=$((failed + 1))
  fi
}

command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu_check: no nvidia-smi: no GPU here" >&2; exit 2; }
[ -f "$LIBTORCH/share/cmake/Torch/TorchConfig.cmake" ] || { echo "gpu_check: $LIBTORCH is not a libtorch" >&2; exit 2; }
grep -q "+cu" "$LIBTORCH/build-version" 2>/dev/null || { echo "gpu_check: $LIBTORCH is not a CUDA build" >&2; exit 2; }

configure() {  # configure DIR NCCL
  cmake -S . -B "$1" -G Ninja -DCMAKE_PREFIX_PATH="$LIBTORCH" -DTXL_NCCL="$2" &&
    cmake --build "$1" -j "$JOBS"
}
if find /usr/include /usr/local/cuda/include ${NCCL_ROOT:+"$NCCL_ROOT/include"} -maxdepth 1 -name nccl.h 2>/dev/null |
    grep -q .; then
  step build-nccl configure build-gpu-nccl ON
else
  echo "gpu_check: build-nccl SKIPPED (no nccl.h; set NCCL_ROOT)"
fi
step build configure build-gpu OFF
B=build-gpu
[ -x "$B/server/txl-server" ] || { echo "gpu_check: the build failed; nothing else can run" >&2; exit 1; }

step unit bash -c "$B/tests/model_test && $B/tests/precision_test"

MODEL=model/bundled/shakespeare_char.pt
eval_check() {
  head -c 3000 data/tinyshakespeare.txt >"$OUT/eval.txt"
  for chunk in 0 7 64; do
    "$B/tools/txl-eval" --model "$MODEL" --text "$OUT/eval.txt" --chunk "$chunk" --logprobs "$OUT/cpu.$chunk" || return 1
    "$B/tools/txl-eval" --model "$MODEL" --text "$OUT/eval.txt" --chunk "$chunk" --device cuda \
      --logprobs "$OUT/cuda.$chunk" || return 1
    /usr/bin/python3 - "$OUT/cpu.$chunk" "$OUT/cuda.$chunk" <<'EOF' || return 1
import sys
a = [float(x) for x in open(sys.argv[1])]
b = [float(x) for x in open(sys.argv[2])]
worst = max(abs(x - y) for x, y in zip(a, b))
print("%s: %d log-probs, max |cpu - cuda| = %.3g" % (sys.argv[2], len(a), worst))
sys.exit(0 if len(a) == len(b) and worst <= 1e-4 else 1)
EOF
  done
}
step eval eval_check

step servers env TXL_TEST_SERVER_FLAGS="--device cuda" \
  ctest --test-dir "$B" --output-on-failure -R '^(python_client|rewind|offload|durability|migration|refusals)$'

cross_device() {
  PYTHONPATH=tests/integration:client/python:$B/client/python/gen /usr/bin/python3 - "$B" "$MODEL" <<'EOF'
import sys
import txl_procs
from txl_client import TxlClient, txl_pb2
bin_dir, model = sys.argv[1], sys.argv[2]
gpu = txl_procs.Server(bin_dir, model, "--device", "cuda")
cpu = txl_procs.Server(bin_dir, model)
try:
    a, b = TxlClient(gpu.address), TxlClient(cpu.address)
    for src, dst, name in ((a, b, "cuda -> cpu"), (b, a, "cpu -> cuda")):
        sid = src.create_session().session_id
        list(src.generate("To be, or not to be", session_id=sid, max_new_tokens=8, temperature=0.0))
        meta = (("txl-session-id", sid),)
        blob = b"".join(c.data for c in src.stub.ExportSession(txl_pb2.ExportSessionRequest(session_id=sid),
                                                                metadata=meta))
        copy = dst.stub.ImportSession(iter([txl_pb2.ImportSessionRequest(data=blob)])).session_id
        want = [t.id for r in src.generate("", session_id=sid, max_new_tokens=16, temperature=0.0) for t in r.tokens]
        got = [t.id for r in dst.generate("", session_id=copy, max_new_tokens=16, temperature=0.0) for t in r.tokens]
        print(name, "same greedy continuation:", want == got)
        assert want == got, (want, got)
finally:
    gpu.stop(check=False)
    cpu.stop(check=False)
EOF
}
step cross-device cross_device

step train ctest --test-dir "$B" --output-on-failure -R '^train_cli$'
step bench "$B/bench/engine_bench" --device cuda --only P1,P3 --reps 3 --json "$OUT/engine_cuda.json"

echo "gpu_check: $failed step(s) failed; logs in $OUT/"
exit "$failed"
