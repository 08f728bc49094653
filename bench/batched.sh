#!/usr/bin/env bash
# Aggregate decode speed at 1, 4, 16 and 64 concurrent sequences: kite's scheduler (kite bench
# --parallel) against llama.cpp's llama-batched-bench on the same GGUF, same threads, same run.
# Not run in CI. Needs llama.cpp built by bench/build-llama-cpp.sh (target llama-batched-bench)
# and the synthetic model file written by bench/compare-llama-cpp.sh.
#   bench/batched.sh [FILE=/tmp/kite-bench/llama-1b-Q4_K_M.gguf] [NPL=1,4,16,64] [PP=128] [TG=32]
set -euo pipefail
cd "$(dirname "$0")/.."
file="${1:-/tmp/kite-bench/llama-1b-Q4_K_M.gguf}"
npl="${2:-1,4,16,64}"
pp="${3:-128}"
tg="${4:-32}"
llama="${LLAMA_CPP_DIR:-/tmp/llama.cpp}/build/bin"
kite="${KITE:-build/tools/kite}"
threads="${THREADS:-$(nproc)}"
max_b="$(tr ',' '\n' <<<"$npl" | sort -n | tail -1)"
ctx=$(( max_b * (pp + tg + 1) ))
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads, $file"
echo "\$ llama-batched-bench -m $file -c $ctx -b 2048 -ub 512 -npp $pp -ntg $tg -npl $npl -t $threads"
"$llama/llama-batched-bench" -m "$file" -c "$ctx" -b 2048 -ub 512 -npp "$pp" -ntg "$tg" -npl "$npl" -t "$threads" \
  2>/dev/null | grep -E "^\|"
echo "\$ kite bench -m $file --parallel $npl -p $pp -n $tg -t $threads"
"$kite" bench -m "$file" --parallel "$npl" -p "$pp" -n "$tg" -t "$threads" 2>/dev/null
