#!/usr/bin/env bash
# The whole test suite: build, every ctest test, the op tests on aarch64 under qemu, then each
# fuzz target for a bounded time
# (KITE_FUZZ_SECONDS per target, default 30; 0 skips fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${KITE_BUILD_DIR:-build}"
bash scripts/build.sh
# The Vulkan tests run on lavapipe (install-deps.sh installs it): here a missing device fails them
# rather than skipping.
KITE_REQUIRE_VULKAN="${KITE_REQUIRE_VULKAN:-1}" ctest --test-dir "$build" -j "$(nproc)" --output-on-failure
# The op conformance tests on aarch64 (NEON kernels), cross-built and run under qemu-user;
# KITE_ARM_TESTS=0 skips them.
if [ "${KITE_ARM_TESTS:-1}" != "0" ]; then
  bash scripts/test-arm64.sh
fi
if [ "${KITE_FUZZ_SECONDS:-30}" != "0" ]; then
  bash scripts/fuzz.sh "${KITE_FUZZ_SECONDS:-30}"
fi
