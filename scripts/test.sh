#!/usr/bin/env bash
# The whole test suite: build, every ctest test, then each fuzz target for a bounded time
# (KITE_FUZZ_SECONDS per target, default 30; 0 skips fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${KITE_BUILD_DIR:-build}"
bash scripts/build.sh
ctest --test-dir "$build" -j "$(nproc)" --output-on-failure
if [ "${KITE_FUZZ_SECONDS:-30}" != "0" ]; then
  bash scripts/fuzz.sh "${KITE_FUZZ_SECONDS:-30}"
fi
