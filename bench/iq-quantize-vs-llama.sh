#!/usr/bin/env bash
# kite's IQ quantizers against llama-quantize's, like for like: for each test model, llama-imatrix
# makes one importance matrix (tinyshakespeare, 40 chunks of 256 tokens), and both tools quantize
# the same f16 file to each low-bit mix with it. kite perplexity scores both files on the held-out
# text (-c 256, llama.cpp's definition; one evaluator, so only the quantization differs) and the
# wall time of each quantization (-t THREADS) is printed beside. Not run in CI. Needs llama.cpp
# built by bench/build-llama-cpp.sh.
#   bench/iq-quantize-vs-llama.sh [MIXES="IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S IQ3_M"]
#   MODELS (default "llama-draft llama-target qwen2-tiny qwen3-tiny"), THREADS (default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
mixes="${1:-IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S IQ3_M}"
models="${MODELS:-llama-draft llama-target qwen2-tiny qwen3-tiny}"
llama="${LLAMA_CPP_DIR:-/tmp/llama.cpp}/build/bin"
kite="${KITE:-build/tools/kite}"
data="${KITE_TESTDATA_DIR:-../shared/testdata}"
work="${BENCH_DIR:-/tmp/kite-iq-quantize}"
threads="${THREADS:-$(nproc)}"
mkdir -p "$work"
for tool in "$llama/llama-quantize" "$llama/llama-imatrix" "$kite"; do
  [ -x "$tool" ] || { echo "missing $tool (bench/build-llama-cpp.sh builds llama.cpp; scripts/build.sh kite)" >&2; exit 1; }
done

kite_ppl() {  # FILE -> kite's perplexity
  "$kite" perplexity -m "$1" -f "$data/heldout.txt" -c 256 -t "$threads" --json 2>/dev/null |
    sed -n 's/.*"ppl": \([0-9.]*\).*/\1/p'
}
seconds() {  # COMMAND... -> its wall time in seconds (output discarded; a failure stops the script)
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t0 $t1" | awk '{printf "%.2f", $2 - $1}'
}

echo "| model | mix | kite ppl | llama.cpp ppl | kite/llama.cpp - 1 | kite s | llama.cpp s |"
echo "|---|---|---:|---:|---:|---:|---:|"
for m in $models; do
  f16="$work/$m-f16.gguf"
  if [ ! -f "$f16" ]; then
    if [ -f "$data/gguf/$m-f16.gguf" ]; then cp "$data/gguf/$m-f16.gguf" "$f16"
    else "$kite" convert "$data/models/$m" -o "$f16" --type f16 >/dev/null 2>&1; fi
  fi
  imatrix="$work/$m-imatrix.gguf"
  [ -f "$imatrix" ] || "$llama/llama-imatrix" -m "$f16" -f "$data/corpus/tinyshakespeare.txt" -c 256 --chunks 40 \
    -o "$imatrix" -t "$threads" >"$work/imatrix.log" 2>&1
  for mix in $mixes; do
    ks=$(seconds "$kite" quantize "$f16" "$work/k.gguf" "$mix" --imatrix "$imatrix" -t "$threads")
    ls=$(seconds "$llama/llama-quantize" --imatrix "$imatrix" "$f16" "$work/l.gguf" "$mix" "$threads")
    kp=$(kite_ppl "$work/k.gguf")
    lp=$(kite_ppl "$work/l.gguf")
    echo "| $m | $mix | $kp | $lp | $(awk -v a="$kp" -v b="$lp" 'BEGIN{printf "%+.2f%%", 100 * (a / b - 1)}') | $ks | $ls |"
  done
done
