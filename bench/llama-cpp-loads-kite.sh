#!/usr/bin/env bash
# llama.cpp loading kite's files: kite converts/quantizes the test models (several types, with
# and without an importance matrix from `kite imatrix`), then llama.cpp's llama-perplexity and
# kite perplexity score each file on the held-out text (-c 256, llama.cpp's definition), side by
# side. Also llama-quantize reading kite's imatrix file, and (when llama-imatrix is built) kite
# reading llama-imatrix's. Not run in CI. Needs llama.cpp built by bench/build-llama-cpp.sh.
#   bench/llama-cpp-loads-kite.sh [TYPES="Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0 Q3_K_M Q2_K IQ4_NL"]
#   (llama-target, 6x slower to score: TARGET_TYPES, default "Q4_K_M Q3_K_M Q2_K"; llama-quantize
#   reading kite's imatrix runs on LQ_MODELS, default "draft")
set -euo pipefail
cd "$(dirname "$0")/.."
types="${1:-Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0 Q3_K_M Q2_K IQ4_NL}"
target_types="${TARGET_TYPES:-Q4_K_M Q3_K_M Q2_K}"
lq_models="${LQ_MODELS:-draft}"
imatrix_types="${IMATRIX_TYPES:-Q4_K_M Q3_K_M Q2_K}"
llama="${LLAMA_CPP_DIR:-/tmp/llama.cpp}/build/bin"
kite="${KITE:-build/tools/kite}"
data="${KITE_TESTDATA_DIR:-../shared/testdata}"
work="${BENCH_DIR:-/tmp/kite-llama-loads}"
threads="${THREADS:-$(nproc)}"
chunks="${IMATRIX_CHUNKS:-200}"  # calibration: 200 chunks of 256 tokens of the training corpus
mkdir -p "$work"
heldout="$data/heldout.txt"

llama_ppl() {  # FILE -> llama.cpp's perplexity, "load-failed", or "n/a" (no final line, twice)
  local log="$work/llama-perplexity.log" try
  for try in 1 2; do
    "$llama/llama-perplexity" -m "$1" -f "$heldout" -c 256 -b 256 -t "$threads" >"$log" 2>&1 ||
      { echo "load-failed"; return 0; }
    if grep -q 'Final estimate: PPL' "$log"; then
      grep -o 'Final estimate: PPL = [0-9.]*' "$log" | awk '{print $5}'
      return 0
    fi
  done
  echo "n/a"
}
kite_ppl() {  # FILE -> kite's perplexity
  "$kite" perplexity -m "$1" -f "$heldout" -c 256 -t "$threads" --json 2>/dev/null |
    sed -n 's/.*"ppl": \([0-9.]*\).*/\1/p'
}
row() {  # LABEL FILE
  local k l
  k=$(kite_ppl "$2")
  l=$(llama_ppl "$2")
  printf "| %-34s | %8s | %10s | %10s | %s |\n" "$1" "$(du -k "$2" | cut -f1) KiB" "$k" "$l" \
    "$(awk -v k="$k" -v l="$l" 'BEGIN { if (l + 0 > 0) printf "%+.3f%%", 100 * (k - l) / l; else print "-" }')"
}

echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads"
echo "# kite $("$kite" --version | cut -d' ' -f2); llama.cpp: $("$llama/llama-perplexity" --version 2>&1 | grep -m1 version || true)"
echo
draft_f16="$data/gguf/llama-draft-f16.gguf"
target_f16="$work/llama-target-f16.gguf"
[ -f "$target_f16" ] || "$kite" convert "$data/models/llama-target" -o "$target_f16" --type f16 >/dev/null
for m in draft target; do
  src=$([ $m = draft ] && echo "$draft_f16" || echo "$target_f16")
  imat="$work/llama-$m.imatrix.gguf"
  [ -f "$imat" ] || "$kite" imatrix -m "$src" -f "$data/corpus/tinyshakespeare.txt" \
    -f "$data/corpus/war_and_peace.txt" -c 256 --chunks "$chunks" -t "$threads" -o "$imat" >&2
  echo "## llama-$m (imatrix: $chunks chunks of 256 tokens of corpus/, not the held-out text)"
  echo
  echo "| file (written by kite)             |     size | kite ppl   | llama.cpp  | kite vs llama.cpp |"
  echo "|------------------------------------|----------|------------|------------|-------------------|"
  row "kite convert f16" "$src"
  for t in $([ $m = draft ] && echo "$types" || echo "$target_types"); do
    out="$work/llama-$m-$t.gguf"
    [ -f "$out" ] || "$kite" quantize "$src" "$out" "$t" -t "$threads" >/dev/null
    row "kite quantize $t" "$out"
  done
  for t in $imatrix_types; do
    out="$work/llama-$m-$t-imatrix.gguf"
    [ -f "$out" ] || "$kite" quantize "$src" "$out" "$t" --imatrix "$imat" -t "$threads" >/dev/null 2>&1
    row "kite quantize $t --imatrix" "$out"
    # llama-quantize reading kite's imatrix file.
    [[ " $lq_models " == *" $m "* ]] || continue
    lq="$work/llama-$m-$t-llama-quantize-kite-imatrix.gguf"
    if [ ! -f "$lq" ]; then
      "$llama/llama-quantize" --imatrix "$imat" "$src" "$lq" "$t" "$threads" >"$work/lq.log" 2>&1 ||
        { echo "llama-quantize --imatrix failed:"; tail -5 "$work/lq.log"; }
    fi
    [ -f "$lq" ] && row "llama-quantize $t --imatrix (kite's)" "$lq"
  done
  if [ -x "$llama/llama-imatrix" ]; then  # kite reading llama-imatrix's file
    limat="$work/llama-$m.llama-imatrix.gguf"
    [ -f "$limat" ] || "$llama/llama-imatrix" -m "$src" -f "$data/corpus/tinyshakespeare.txt" -c 256 \
      --chunks "$chunks" -t "$threads" -o "$limat" >"$work/li.log" 2>&1
    out="$work/llama-$m-Q2_K-kite-llama-imatrix.gguf"
    [ -f "$out" ] || "$kite" quantize "$src" "$out" Q2_K --imatrix "$limat" -t "$threads" >/dev/null 2>&1
    row "kite quantize Q2_K --imatrix (llama's)" "$out"
  fi
  echo
done
