#!/usr/bin/env bash
# The whole test suite: build, every ctest test, the CUDA backend's tests on the CPU CUDA emulator
# (in three execution orders, then sanitized), the op tests on aarch64 under qemu, then each fuzz
# target for a bounded time (KITE_FUZZ_SECONDS per target, default 30; 0 skips fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${KITE_BUILD_DIR:-build}"
bash scripts/build.sh
# The Vulkan tests run on lavapipe (install-deps.sh installs it): here a missing device fails them
# rather than skipping.
KITE_REQUIRE_VULKAN="${KITE_REQUIRE_VULKAN:-1}" ctest --test-dir "$build" -j "$(nproc)" --output-on-failure
# The CUDA backend on the CPU CUDA emulator (backends/cuda/emu): its kernels, streams, graphs and
# cuBLAS calls against the CPU backend, without a GPU. KITE_CUDA_EMU_TESTS=0 skips it.
if [ "${KITE_CUDA_EMU_TESTS:-1}" != "0" ]; then
  emu="${KITE_EMU_BUILD_DIR:-build-cuda-emu}"
  KITE_BUILD_DIR="$emu" bash scripts/build.sh -DKITE_CUDA_EMU=ON -DKITE_VULKAN=OFF
  ctest --test-dir "$emu" -j "$(nproc)" --output-on-failure -R '^(cuda|ops|doctest-case-names)'
  # Again with blocks and threads run last first, then shuffled: a GPU promises no order, so a
  # kernel whose result depends on it (a missing barrier) fails here (emu/README.md). The
  # perplexity sweep, which adds no kernel the others do not run, runs once.
  for schedule in reverse shuffle; do
    KITE_CUDA_EMU_SCHEDULE=$schedule ctest --test-dir "$emu" -j "$(nproc)" --output-on-failure \
      -R '^(cuda|ops)' -E 'every GGUF file'
  done
  # And with the CUDA backend and its kernels under AddressSanitizer and UBSan: a read past an
  # allocation or a misaligned load faults on a GPU, and here fails the test (only those sources
  # are instrumented, so ccache has the rest from the build above). The F16 greedy test adds
  # models, not kernels. KITE_CUDA_SANITIZE_TESTS=0 skips it.
  if [ "${KITE_CUDA_SANITIZE_TESTS:-1}" != "0" ]; then
    san="${emu}-sanitize"
    export CCACHE_BASEDIR="$PWD"
    cmake -S . -B "$san" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKITE_CUDA_EMU=ON -DKITE_VULKAN=OFF \
      -DKITE_CUDA_EMU_SANITIZE=ON >/dev/null
    cmake --build "$san" -j "$(nproc)" --target kite-tests
    ctest --test-dir "$san" -j "$(nproc)" --output-on-failure -R '^(cuda|ops)' \
      -E 'every GGUF file|greedy output of the F16'
  fi
fi
# The op conformance tests on aarch64 (NEON kernels), cross-built and run under qemu-user;
# KITE_ARM_TESTS=0 skips them.
if [ "${KITE_ARM_TESTS:-1}" != "0" ]; then
  bash scripts/test-arm64.sh
fi
if [ "${KITE_FUZZ_SECONDS:-30}" != "0" ]; then
  bash scripts/fuzz.sh "${KITE_FUZZ_SECONDS:-30}"
fi
