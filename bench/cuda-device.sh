#!/usr/bin/env bash
# THE one script a GPU session runs on the lent NVIDIA machine (the device tool's `run`), after
# bench/cuda-device-prepare.sh here:
#   run  command="bash bench/cuda-device.sh"  carry=["build-gpu-carry"]  timeout_s=600
# Steps, each time-boxed, < 8 minutes together; everything lands in $OUT/summary.md (the table
# and the numbers) and $OUT/full.log (all output):
#   1. binaries: the prebuilt ones from build-gpu-carry/ (the device image lacks kite's Debian
#      build dependencies); without them, a CMake build with KITE_CUDA_ARCHITECTURES=90 -j16
#   2. the card's bandwidth (kite-cuda-bandwidth: a device-to-device copy kernel)
#   3. op conformance on CUDA against the double references (kite-tests -tc="ops:*")
#   4. the GPU tests of tests/test_cuda.cpp (greedy equality, perplexity, batch invariance)
#   5. kite bench --device cuda --synthetic llama-1b/3b/8b x q4_K/q4_0/q8_0: pp512, tg128
#   6. batched decode at 1, 16 and 64 sequences (llama-1b q4_K)
# (4b and 5b repeat the GPU tests and decode with KITE_CUDA_GRAPHS=1: CUDA graphs, off by default.)
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
out="${OUT:-/tmp/kite-cuda-out}"
mkdir -p "$out"
sum="$out/summary.md"
log="$out/full.log"
: >"$sum"
: >"$log"
t_start=$(date +%s)
say() { echo "$*" | tee -a "$log" >>"$sum"; }

# run_step NAME SECONDS CMD...: runs CMD with a time limit; output to the log, a table row to the
# summary. Lines of the output matching $KEEP (a regex) are also copied to the summary.
KEEP=''
run_step() {
  local name=$1 limit=$2
  shift 2
  local t0 rc tmp
  t0=$(date +%s)
  tmp=$(mktemp)
  echo "=== $name: $*" >>"$log"
  timeout -k 5 "$limit" "$@" >"$tmp" 2>&1
  rc=$?
  cat "$tmp" >>"$log"
  local status="ok"
  [ $rc -ne 0 ] && status="FAIL rc=$rc"
  [ $rc -eq 124 ] && status="TIMEOUT after ${limit}s"
  echo "| $name | $status | $(( $(date +%s) - t0 ))s | \`$*\` |" >>"$sum"
  if [ -n "$KEEP" ]; then grep -E "$KEEP" "$tmp" | sed 's/^/    /' >>"$sum"; fi
  rm -f "$tmp"
  return $rc
}

say "# kite CUDA device run, $(date -u '+%F %T') UTC"
say ""
say "$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1)"
say "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
say ""
say "| step | result | time | command |"
say "|---|---|---|---|"

# 1. Binaries.
carry="$root/build-gpu-carry"
bin=/tmp/kite-bin  # (the prebuilt path below sets its own)
if [ -f "$carry/kite-bin.tar.xz" ]; then
  mkdir -p /tmp/kite-dist
  tar -C /tmp/kite-dist -xJf "$carry/kite-bin.tar.xz"
  bin=/tmp/kite-dist/bin
  # CUDA runtime and cuBLAS from the image (toolkit or the pip wheels).
  cuda_libs=$(find /usr/local/cuda/lib64 /usr/local/cuda*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
    /opt -maxdepth 8 \( -name 'libcublas.so.13*' -o -name 'libcudart.so.13*' \) -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
  export LD_LIBRARY_PATH="/tmp/kite-dist/lib:${cuda_libs}${LD_LIBRARY_PATH:-}"
  # The paths compiled into kite-tests (test data, the kite binary, the build folder).
  # shellcheck disable=SC1091
  source "$carry/paths.env"
  mkdir -p "$(dirname "$KITE_TESTDATA_DIR")" "$(dirname "$KITE_EXE")" "$KITE_BINARY_DIR"
  [ -e "$KITE_TESTDATA_DIR" ] || ln -s "$carry/testdata" "$KITE_TESTDATA_DIR"
  [ -e "$KITE_EXE" ] || ln -s "$bin/kite" "$KITE_EXE"
  echo "| binaries | prebuilt (build-gpu-carry) | | LD_LIBRARY_PATH=$LD_LIBRARY_PATH |" >>"$sum"
  run_step "ldd" 10 bash -c "ldd $bin/kite-tests | grep -E 'not found|cublas|cudart' || true"
else
  build="$root/build-gpu"
  launcher=""
  command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
  run_step "configure" 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKITE_CUDA=ON \
    -DKITE_CUDA_ARCHITECTURES=90 $launcher || { say "configure failed: see full.log"; exit 1; }
  run_step "build" 300 cmake --build "$build" --target kite kite-tests kite-cuda-bandwidth -j16 ||
    { say "build failed: see full.log"; exit 1; }
  mkdir -p "$bin"
  ln -sf "$build/tools/kite" "$bin/kite"
  ln -sf "$build/tests/kite-tests" "$bin/kite-tests"
  ln -sf "$build/bench/kite-cuda-bandwidth" "$bin/kite-cuda-bandwidth"
fi

# 2. Bandwidth.
KEEP='GB/s|device'
run_step "bandwidth" 60 "$bin/kite-cuda-bandwidth" 0 2048

# 3. Op conformance on CUDA (every op and weight type against the double references).
KEEP='test cases|assertions|ERROR|FAILED|skipped, no CUDA'
run_step "ops conformance" 150 "$bin/kite-tests" -tc="ops:*" --duration=true

# 4. GPU tests.
KEEP='test cases|assertions|ERROR|FAILED|on cuda|greedy|diverged|skipped'
run_step "cuda tests" 180 "$bin/kite-tests" -tc="cuda:*" --duration=true

# 4b. The same GPU tests with CUDA graphs on (captured decode steps replayed; off by default).
KEEP='test cases|assertions|ERROR|FAILED|graph capture|diverged'
KITE_CUDA_GRAPHS=1 run_step "cuda tests, graphs" 150 "$bin/kite-tests" -tc="cuda: greedy*,cuda: a sequence*"

# 5. Synthetic models: prompt processing (pp512) and generation (tg128). The 8B shape first (the
# bandwidth goal is stated for it); each run builds its synthetic model on the host first
# (single-threaded: seconds for 1B, tens of seconds for 8B), hence the limits.
KEEP='^\|'
for run in "llama-8b q4_K 100" "llama-1b q4_K 50" "llama-8b q4_0 100" "llama-8b q8_0 110" "llama-1b q4_0 50" \
           "llama-1b q8_0 50" "llama-3b q4_K 70" "llama-3b q4_0 70" "llama-3b q8_0 80"; do
  read -r shape type limit <<<"$run"
  if [ $(( $(date +%s) - t_start )) -gt 360 ]; then say "| bench $shape $type | skipped (time box) | | |"; continue; fi
  run_step "bench $shape $type" "$limit" "$bin/kite" bench --device cuda --synthetic "$shape" --type "$type" \
    -p 512 -n 128 -r 2
done

# 5b. Decode with CUDA graphs on (KITE_CUDA_GRAPHS=1), 1B shape.
KEEP='^\||graph capture'
if [ $(( $(date +%s) - t_start )) -lt 400 ]; then
  KITE_CUDA_GRAPHS=1 run_step "bench llama-1b q4_K graphs" 50 "$bin/kite" bench --device cuda --synthetic llama-1b \
    --type q4_K -p 0 -n 128 -r 2
fi

# 6. Batched decode (continuous batching) at 1, 16 and 64 sequences.
if [ $(( $(date +%s) - t_start )) -lt 420 ]; then
  KEEP='^\||S_TG|t/s'
  run_step "batched llama-1b q4_K" 50 "$bin/kite" bench --device cuda --synthetic llama-1b --type q4_K \
    --parallel 1,16,64 -p 128 -n 32
fi

say ""
say "total $(( $(date +%s) - t_start ))s"
cat "$sum"
