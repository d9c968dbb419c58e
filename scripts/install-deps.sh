#!/usr/bin/env bash
# Installs the Debian 12 packages txl-serve needs. Idempotent: packages already
# present are skipped, so a second run does nothing but check.
#   scripts/install-deps.sh            everything to build and test
#   scripts/install-deps.sh --runtime  only what the installed binaries load (the container's
#                                      runtime stage; tests/integration/test_container.py checks
#                                      the list against the binaries' NEEDED libraries)
set -euo pipefail

RUNTIME_PACKAGES=(
  libtorch1.13 libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623
  libprometheus-cpp-core1.0 libopenblas0-openmp
  # GCC's OpenMP runtime, which model/ compiles its parallel loops with, as libtorch does.
  libgomp1
  # The Redis state store client, for --state_store=redis://HOST:PORT.
  libhiredis0.14
  # TLS on the HTTP port: Boost.Asio's OpenSSL streams.
  libssl3
)

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev python3-torch python3-numpy
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # The HTTP front end: Boost.Beast/Asio (header-only) and OpenSSL for its TLS.
  libboost-dev libssl-dev
  libprotoc-dev python3-grpcio python3-protobuf
  prometheus-cpp-dev libabsl-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev
  # Without an optimised BLAS libtorch uses the reference BLAS (~10x slower).
  libopenblas0-openmp
  # The playground's browser test (tests/integration/test_playground.py) and the curl SSE check.
  chromium chromium-driver python3-selenium curl
  # The official OpenAI Python SDK test (pip installs the pinned SDK into a venv in the build tree).
  python3-venv
  # Real peers of the deployment tests (tests/integration): the proxy, the scraper, YAML; and a
  # JSON Schema validator for response_format's outputs (test_http.py).
  nginx-light prometheus python3-yaml python3-jsonschema
  # The security tests make their CA and certificates with the openssl CLI.
  openssl
  # The Redis state store: its client library, and the server its tests run on loopback.
  redis-server libhiredis-dev
  # Sanitizer and fuzzing builds (scripts/test.sh, docs/ROBUSTNESS.md): clang, its sanitizer and
  # libFuzzer runtimes (libclang-rt, only recommended by clang), llvm-symbolizer for the reports.
  clang-14 libclang-rt-14-dev llvm-14
  # The formatting check of every C++ file (.clang-format; test clang_format).
  clang-format-14
  # The GPU bundle (scripts/gpu_bundle.sh) sets its binaries' and libraries' RUNPATH.
  patchelf
)

case "${1:-}" in
  "") ;;
  --runtime) PACKAGES=("${RUNTIME_PACKAGES[@]}") ;;
  *) echo "usage: $0 [--runtime]" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: not root and no sudo; install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
