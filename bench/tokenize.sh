#!/usr/bin/env bash
# Tokenizer speed, kite vs llama.cpp's llama-tokenize, on the same vocabulary and text.
# Not run in CI. Usage: bench/tokenize.sh [KITE_BUILD_DIR] [VOCAB.gguf] [TEXT]
#   defaults: build, testdata vocab/ggml-vocab-llama-bpe.gguf, corpus/war_and_peace.txt
# llama-tokenize is built with bench/build-llama-cpp.sh (source from node-llama-cpp 3.22.1) into
# $LLAMA_CPP_DIR (default /tmp/llama.cpp) unless it is there already.
#
# Both programs are timed end to end (load + tokenize + print the ids) on the text and on a
# one-word text; the difference is the tokenizing time. Runs alternate, 5 each, medians reported.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
testdata=${KITE_TESTDATA_DIR:-$root/../shared/testdata}
vocab=${2:-$testdata/vocab/ggml-vocab-llama-bpe.gguf}
text=${3:-$testdata/corpus/war_and_peace.txt}
llama_dir=${LLAMA_CPP_DIR:-/tmp/llama.cpp}
llama_tok=$llama_dir/build/bin/llama-tokenize
kite=$build/tools/kite

[ -x "$kite" ] || { echo "no $kite: build kite first" >&2; exit 1; }
[ -x "$llama_tok" ] || "$root/bench/build-llama-cpp.sh" "$llama_dir" llama-tokenize
command -v bc >/dev/null || { echo "bench/tokenize.sh needs bc" >&2; exit 1; }
tiny=$(mktemp)
trap 'rm -f "$tiny"' EXIT
echo "Hello" >"$tiny"

# Seconds (wall) of one run of a command, output discarded.
secs() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

kite_cmd() { "$kite" tokenize -m "$vocab" --no-bos --ids-only --file "$1"; }
llama_cmd() { "$llama_tok" -m "$vocab" -f "$1" --ids --no-bos --log-disable; }

kite_ids=$(kite_cmd "$text" | tr ' ' '\n' | grep -v '^$')
llama_ids=$(llama_cmd "$text" 2>/dev/null | tr -d '[],' | tr ' ' '\n' | grep -v '^$')
n_tokens=$(echo "$kite_ids" | wc -l)
echo "text: $text ($(wc -c <"$text") bytes), vocab: $vocab"
echo "tokens: kite $n_tokens, llama.cpp $(echo "$llama_ids" | wc -l)"
if [ "$kite_ids" = "$llama_ids" ]; then echo "ids: identical"; else echo "ids: DIFFER"; fi

declare -a kf kt lf lt
for _ in 1 2 3 4 5; do
  kf+=("$(secs kite_cmd "$text")"); lf+=("$(secs llama_cmd "$text")")
  kt+=("$(secs kite_cmd "$tiny")"); lt+=("$(secs llama_cmd "$tiny")")
done
k_full=$(printf '%s\n' "${kf[@]}" | median); k_tiny=$(printf '%s\n' "${kt[@]}" | median)
l_full=$(printf '%s\n' "${lf[@]}" | median); l_tiny=$(printf '%s\n' "${lt[@]}" | median)
k=$(echo "$k_full - $k_tiny" | bc -l); l=$(echo "$l_full - $l_tiny" | bc -l)
printf 'kite:      %.3f s end to end, %.3f s load -> tokenize %.3f s = %.2f M tokens/s\n' \
  "$k_full" "$k_tiny" "$k" "$(echo "$n_tokens / $k / 1000000" | bc -l)"
printf 'llama.cpp: %.3f s end to end, %.3f s load -> tokenize %.3f s = %.2f M tokens/s\n' \
  "$l_full" "$l_tiny" "$l" "$(echo "$n_tokens / $l / 1000000" | bc -l)"
printf 'ratio kite / llama.cpp tokens/s: %.2f\n' "$(echo "$l / $k" | bc -l)"
"$kite" tokenize -m "$vocab" --no-bos --bench --file "$text"
