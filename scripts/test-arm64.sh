#!/usr/bin/env bash
# The op conformance tests on aarch64, cross-built on this machine and run under qemu-user:
# once on a CPU model with the dot-product extension (-cpu max: levels scalar, neon, neondot)
# and once on one without it (-cpu cortex-a53: scalar, neon), so both NEON kernel tables and
# the run-time choice between them are tested. qemu measures correctness only, not speed.
#
# Needs (Debian 12): apt-get install g++-aarch64-linux-gnu qemu-user
# Builds tests/ops_only (core, quant formats, backends; no PCRE2/httplib) into
# KITE_ARM_BUILD_DIR (default build-arm64). Extra arguments go to doctest (default -tc=ops:*).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
build="${KITE_ARM_BUILD_DIR:-build-arm64}"
sysroot=/usr/aarch64-linux-gnu
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  command -v "$tool" >/dev/null || { echo "test-arm64: $tool not found (apt-get install g++-aarch64-linux-gnu qemu-user)" >&2; exit 1; }
done
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(-tc="ops:*")

start=$(date +%s)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S tests/ops_only -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchain-aarch64-linux-gnu.cmake" >/dev/null
cmake --build "$build" -j "$(nproc)"
built=$(date +%s)

# cpu model -> the best level the tests must report on it
for run in "max neondot" "cortex-a53 neon"; do
  set -- $run
  echo "== qemu-aarch64 -cpu $1 (expect best level $2)"
  out=$(qemu-aarch64 -cpu "$1" -L "$sysroot" "$build/kite-ops-tests" "${args[@]}" 2>&1) || { echo "$out"; exit 1; }
  echo "$out" | grep -E "MESSAGE: cpu features|test cases:|assertions:" || true
  if echo "$out" | grep -q "MESSAGE: cpu features" && ! echo "$out" | grep -q "best level $2\$"; then
    echo "test-arm64: -cpu $1 did not pick level $2" >&2
    exit 1
  fi
done
echo "test-arm64: passed (build $((built - start)) s, tests $(($(date +%s) - built)) s)"
