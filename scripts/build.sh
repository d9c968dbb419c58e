#!/usr/bin/env bash
# Configures and builds txl-serve into build/ (Release flags, ccache if present).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
