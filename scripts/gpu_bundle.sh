#!/usr/bin/env bash
# Packs what a bare GPU machine needs beyond its own torch 2.11.0+cu130 into gpu-bundle/ (ignored by
# git; at most 48 MiB), so that scripts/gpu_check.sh runs there in one device call:
#   scripts/gpu_bundle.sh        (builds build-cuda/ first with scripts/cuda_build.sh)
# gpu-bundle/txl-gpu.tar.xz holds a tree shaped like a build folder, so the test scripts take it
# as their --bin-dir:
#   server/ client/ tools/ bench/ tests/   stripped binaries built against torch 2.11.0+cu130,
#                                          RUNPATH $ORIGIN/../lib
#   lib/                                   the shared libraries they load that are neither torch's
#                                          (found in the device's site-packages), the CUDA
#                                          driver's, nor the C/C++ runtime's (glibc, libstdc++,
#                                          libgcc_s): gRPC, Protobuf, Abseil, prometheus-cpp, ...
#   client/python/gen/                     the Python client's generated stubs
#   MANIFEST                               what was built from which commit, with which torch
# The source tree (tests, models, data) travels with the device call as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
OUT=gpu-bundle
LIMIT_MIB=48
scripts/cuda_build.sh
PREFIX=$(scripts/cuda_build.sh --fetch | tail -1)
command -v patchelf >/dev/null || { echo "gpu_bundle: patchelf is missing (scripts/install-deps.sh)" >&2; exit 2; }

BINARIES=(server/txl-server client/txl-client tools/txl-eval tools/txl-init tools/txl-train bench/engine_bench
  bench/step_loop tests/model_test tests/precision_test)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
for b in "${BINARIES[@]}"; do
  mkdir -p "$stage/$(dirname "$b")"
  strip --strip-unneeded -o "$stage/$b" "$BUILD_DIR/$b"
  patchelf --set-rpath '$ORIGIN/../lib' "$stage/$b"
done

# The libraries to carry: whatever the loader resolves outside torch's prefix, the CUDA toolkit
# and the base runtime (scripts/bundle_closure.py decides, and gpu_check.sh checks the same way).
LD_LIBRARY_PATH="$PREFIX/torch/lib" /usr/bin/python3 scripts/bundle_closure.py --carry \
  "${BINARIES[@]/#/$BUILD_DIR/}" | while read -r lib; do
  cp -L "$lib" "$stage/lib/"
done
for l in "$stage"/lib/*; do
  strip --strip-unneeded "$l"
  patchelf --set-rpath '$ORIGIN' "$l"
done

mkdir -p "$stage/client/python"
cp -r "$BUILD_DIR/client/python/gen" "$stage/client/python/"
find "$stage/client/python/gen" -name __pycache__ -prune -exec rm -rf {} +
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%FT%TZ) on $(uname -n)"
  echo "torch $(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$PREFIX/torch/version.py")"
  (cd "$stage" && find . -type f | sort | xargs ls -l | awk '{print $5, $9}')
} >"$stage/MANIFEST"

mkdir -p "$OUT"
rm -f "$OUT/txl-gpu.tar.xz"
XZ_OPT="-6 -T0" tar -C "$stage" -cJf "$OUT/txl-gpu.tar.xz" .
size=$(stat -c %s "$OUT/txl-gpu.tar.xz")
echo "gpu_bundle: $OUT/txl-gpu.tar.xz: $((size / 1024 / 1024)) MiB ($(ls "$stage/lib" | wc -l) libraries)"
if [ "$size" -gt $((LIMIT_MIB * 1024 * 1024)) ]; then
  echo "gpu_bundle: over the $LIMIT_MIB MiB limit" >&2
  exit 1
fi
