#!/usr/bin/env bash
# kite vs llama.cpp on the same bytes: a synthetic Llama-shaped model written by kite as F16
# GGUF, quantized by llama-quantize, then llama-bench and kite bench alternately (pp512, tg128,
# median of 3, same threads). Not run in CI. Needs llama.cpp built by bench/build-llama-cpp.sh.
#   [DEPTH=4096] bench/compare-llama-cpp.sh [SHAPE=llama-1b] [TYPES="Q4_K_M Q4_0 Q8_0"]
# DEPTH: both run pp and tg after that many tokens in the context (-d; llama-bench's flash
# attention setting stays its default, auto).
set -euo pipefail
cd "$(dirname "$0")/.."
shape="${1:-llama-1b}"
types="${2:-Q4_K_M Q4_0 Q8_0}"
llama="${LLAMA_CPP_DIR:-/tmp/llama.cpp}/build/bin"
kite="${KITE:-build/tools/kite}"
work="${BENCH_DIR:-/tmp/kite-bench}"
threads="${THREADS:-$(nproc)}"
depth="${DEPTH:-0}"
mkdir -p "$work"
f16="$work/$shape-f16.gguf"
[ -f "$f16" ] || "$kite" bench --synthetic "$shape" --type f16 --write-gguf "$f16" -p 0 -n 0
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads, $shape"
for t in $types; do
  q="$work/$shape-$t.gguf"
  [ -f "$q" ] || "$llama/llama-quantize" "$f16" "$q" "$t" >/dev/null 2>&1
  echo "## $t ($(du -h "$q" | cut -f1))"
  echo "\$ llama-bench -m $q -p 512 -n 128 -d $depth -r 3 -t $threads"
  "$llama/llama-bench" -m "$q" -p 512 -n 128 -d "$depth" -r 3 -t "$threads" -o md 2>/dev/null | grep -E "pp512|tg128"
  echo "\$ kite bench -m $q -p 512 -n 128 -d $depth -r 3 -t $threads"
  "$kite" bench -m "$q" -p 512 -n 128 -d "$depth" -r 3 -t "$threads" 2>/dev/null | grep -E "pp512|tg128|bandwidth"
done
