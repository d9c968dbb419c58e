#!/usr/bin/env bash
# The second build: every target against libtorch 2.11.0 with CUDA 13.0, the torch a lent GPU
# machine runs (PyPI's torch==2.11.0 wheel is torch 2.11.0+cu130), into build-cuda/, with this
# machine's nvcc and TXL_NCCL=ON. No GPU is needed: a CUDA build of torch runs on a CPU.
#   scripts/cuda_build.sh            fetch (once), configure (once), build
#   scripts/cuda_build.sh --fetch    only fetch; prints the torch prefix
# Its test checkpoint_versions reads checkpoints across libtorch versions with the main build
# (OTHER_BUILD, default build/, Debian's libtorch 1.13).
# What it fetches, once, into a cache outside the tree (TXL_CUDA_CACHE, default
# ~/.cache/txl-serve), laid out as a site-packages folder so that the libraries' own RUNPATHs
# ($ORIGIN/../../nvidia/...) find each other, as they do on the GPU machine:
#   torch-2.11.0/torch/{include,lib,share}   the wheel's libtorch (pip download + unzip)
#   torch-2.11.0/nvidia/...                  the CUDA libraries libtorch_cuda.so needs that the
#                                            toolkit lacks (cuFile, cuSPARSELt, NVSHMEM), and the
#                                            NCCL torch was built with, headers included
#   pip/                                     a venv whose pip fetches the wheels
# The libtorch 2.x differences are each handled in one place (docs/GPU.md lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.11.0
CACHE=${TXL_CUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/txl-serve}
PREFIX=$CACHE/torch-$TORCH_VERSION
TOOLS=$CACHE/pip
BUILD_DIR=${BUILD_DIR:-build-cuda}
LAYOUT=2  # of the fetched prefix; a cache of another layout is fetched again
JOBS=${JOBS:-$(nproc)}
# The versions torch 2.11.0's wheel names in its Requires-Dist.
NVIDIA_WHEELS=("nvidia-cufile==1.15.1.6.*" nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5
  nvidia-nccl-cu13==2.28.9)

command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "cuda_build: no nvcc (the CUDA 13 toolkit) on PATH or in /usr/local/cuda" >&2; exit 2; }
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

fetch() {
  if [ ! -x "$TOOLS/bin/pip" ]; then
    /usr/bin/python3 -m venv --clear "$TOOLS"
  fi
  [ "$(cat "$PREFIX/.complete" 2>/dev/null)" = "$LAYOUT" ] && return 0
  echo "cuda_build: fetching torch==$TORCH_VERSION (about 530 MB) and its NVIDIA libraries into $PREFIX"
  rm -rf "$PREFIX" "$PREFIX.partial"
  mkdir -p "$PREFIX.partial/wheel"
  # The device's Python is 3.12; libtorch inside is the same for every Python version.
  "$TOOLS/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux_2_28_x86_64 -d "$PREFIX.partial/wheel" "torch==$TORCH_VERSION"
  (cd "$PREFIX.partial" && /usr/bin/python3 - wheel/torch-*.whl <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    # Not torch/include/google: the wheel carries an old Protocol Buffers' headers there, which
    # would shadow Debian's (gRPC's) in every target that sees torch's include path. No torch
    # header this project includes reads them.
    z.extractall(".", [n for n in z.namelist()
                       if n.startswith(("torch/include/", "torch/lib/", "torch/share/")) or n == "torch/version.py"
                       if not n.startswith("torch/include/google/")])
EOF
  )
  rm -rf "$PREFIX.partial/wheel"
  grep -q "__version__ = '$TORCH_VERSION+cu130'" "$PREFIX.partial/torch/version.py" ||
    { echo "cuda_build: PyPI's torch==$TORCH_VERSION is not +cu130: $(cat "$PREFIX.partial/torch/version.py")" >&2; exit 1; }
  "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --target "$PREFIX.partial" "${NVIDIA_WHEELS[@]}"
  echo "$LAYOUT" >"$PREFIX.partial/.complete"
  mv "$PREFIX.partial" "$PREFIX"
}

fetch
if [ "${1:-}" = --fetch ]; then
  echo "$PREFIX"
  exit 0
elif [ -n "${1:-}" ]; then
  echo "usage: $0 [--fetch]" >&2
  exit 2
fi

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # TORCH_CUDA_ARCH_LIST: Hopper (H100, H200), the lent machines; only torch's config reads it,
  # as no target of ours is CUDA source.
  TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} cmake -S . -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_PREFIX_PATH="$PREFIX/torch/share/cmake" \
    -DCMAKE_CUDA_COMPILER="$NVCC" \
    -DTXL_NCCL=ON -DTXL_NCCL_INCLUDE_DIR="$PREFIX/nvidia/nccl/include" \
    -DTXL_OTHER_BUILD="$PWD/${OTHER_BUILD:-build}" \
    ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
