#!/usr/bin/env bash
# README command 2: install what is missing, build, run every test. Then the robustness phases
# (docs/ROBUSTNESS.md), each in a build directory of its own, built with clang:
#   build-asan  the unit and integration suite again under ASan + UBSan
#   build-tsan  the scheduler and session store (server_test) under TSan, and the CUDA kernels on the
#               block emulator (cuda_emulation_test)
#   build-fuzz  a short run of each libFuzzer target from its seed corpus
# Then the CUDA build (docs/GPU.md): every target against libtorch 2.11.0+cu130 (PyPI's torch wheel,
# the lent GPU machines' torch) in build-cuda, its CPU tests, the checkpoints across libtorch
# versions, the GPU bundle and its dry run.
# SANITIZERS=0 skips the robustness phases, CUDA=0 the CUDA ones. Every phase prints its wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}

phase_start=0
phase() {  # phase NAME: ends the previous phase (printing its time) and starts NAME
  local now
  now=$(date +%s)
  if [ -n "${phase_name:-}" ]; then echo "test.sh: phase $phase_name took $((now - phase_start)) s"; fi
  phase_name=${1:-}
  phase_start=$now
  if [ -n "$phase_name" ]; then echo "test.sh: phase $phase_name"; fi
}

phase build
scripts/install-deps.sh
scripts/build.sh
phase test
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$JOBS"

cuda_phases() {
  phase cuda-build
  OTHER_BUILD=${BUILD_DIR:-build} scripts/cuda_build.sh
  phase cuda-test
  # A CUDA build of torch runs on a CPU: the model's and the serving core's unit tests, the
  # bundled model's quality gates (among them the fused pass attention's, which needs 2.x), the
  # reference parity, a server suite, and checkpoints both ways between libtorch 1.13 and 2.11.
  build-cuda/tests/model_test --gtest_brief=1
  build-cuda/tests/precision_test --gtest_brief=1 --gtest_filter='QualityGateTest.FusedPassAttention'
  build-cuda/tests/server_test --gtest_brief=1
  ctest --test-dir build-cuda --output-on-failure -j "$JOBS" \
    -R '^(python_reference|python_client|sampling_reference|checkpoint_versions|help_lists_flags)$'
  phase gpu-dry-run
  # The bundle a GPU machine gets, unpacked and run here on the CPU against torch 2.11 in a venv of
  # its own, with nothing of the build trees on any path.
  scripts/gpu_bundle.sh
  scripts/gpu_check.sh --dry-run --out build-cuda/gpu-dry-run
}

if [ "${SANITIZERS:-1}" = 0 ]; then
  if [ "${CUDA:-1}" != 0 ]; then cuda_phases; fi
  phase
  exit 0
fi

configure() {  # configure DIR CMAKE_ARGS...: once, with clang
  local dir=$1
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    CC=clang-14 CXX=clang++-14 cmake -S . -B "$dir" -G Ninja "$@"
  fi
}

# Sanitizer runtime options. Suppressions name only reports inside Debian's uninstrumented
# libraries, each with its reason (tests/sanitizers/*.supp); our own code is never suppressed.
SAN=$PWD/tests/sanitizers
SYMBOLIZER=/usr/lib/llvm-14/bin/llvm-symbolizer
export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_string_checks=1:external_symbolizer_path=$SYMBOLIZER"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:external_symbolizer_path=$SYMBOLIZER"
export LSAN_OPTIONS="suppressions=$SAN/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:external_symbolizer_path=$SYMBOLIZER"

phase asan-build
configure build-asan -DTXL_SANITIZE=address
cmake --build build-asan -j "$JOBS"
phase asan-test
# Excluded under ASan, each for a reason (docs/ROBUSTNESS.md):
#   container  checks the normal build's binaries against the container's runtime package list
#              (RUNTIME_PACKAGES); clang links sanitizer builds without --as-needed, so they name
#              more libraries (libz, libssl, ...) than the shipped binaries do.
ctest --test-dir build-asan --output-on-failure -j "$JOBS" -E '^(container)$'

phase tsan
configure build-tsan -DTXL_SANITIZE=thread
cmake --build build-tsan -j "$JOBS" --target server_test tsan_selftest cuda_emulation_test
ctest --test-dir build-tsan --output-on-failure -R '^tsan_selftest_'
# The whole server_test binary (every scheduler and session-store test), 20 times over.
build-tsan/tests/server_test --gtest_repeat=20 --gtest_brief=1

phase fuzz
configure build-fuzz -DTXL_FUZZ=ON
cmake --build build-fuzz -j "$JOBS" --target tokenizer_fuzzer request_validation_fuzzer checkpoint_fuzzer \
  session_import_fuzzer openai_json_fuzzer grammar_fuzzer json_schema_fuzzer
ctest --test-dir build-fuzz --output-on-failure -j "$JOBS" -L fuzz
grep -a -E '^([0-9]+/[0-9]+ Test: |stat::number_of_executed_units|stat::average_exec_per_sec)' \
  build-fuzz/Testing/Temporary/LastTest.log || true

if [ "${CUDA:-1}" != 0 ]; then cuda_phases; fi
phase
