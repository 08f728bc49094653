#!/usr/bin/env bash
# Paired A/B decode timing of two kite binaries on a noisy host: PAIRS pairs of short tg runs,
# in ABBA order (neither binary always runs first: the second of two runs here is ~1-2% slower
# on its own), each pair's t/s and B/A, then the median ratio. Shared hosts move their read
# bandwidth by +-30% within minutes, which swamps a 5% change between two -r 3 runs minutes
# apart; a ratio of adjacent runs does not. A may be llama.cpp's llama-bench (built by
# bench/build-llama-cpp.sh; the extra args then go to both, so keep to -t). On a VM, read the
# model file fresh first: its page cache state moved kite's decode by 25% on one host
# (bench/RESULTS.md, twenty-seventh session). Not run in CI.
#   bench/ab.sh A B MODEL [PAIRS=10] [more kite bench args, e.g. -t 1 or --kv-type q8_0]
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,10p "$0" >&2; exit 2; }
a="$1" b="$2" model="$3" pairs="${4:-10}"
shift $(($# < 4 ? $# : 4))
run() {
  if [ "$(basename "$1")" = llama-bench ]; then
    "$1" -m "$model" -p 0 -n 32 -r 1 -o md "${@:2}" 2>/dev/null | awk -F'|' '/tg32/{print $8+0}'
  else
    "$1" bench -m "$model" -p 0 -n 32 -r 1 --bandwidth 50 "${@:2}" 2>/dev/null | awk -F'|' '/tg32/{print $7+0}'
  fi
}
echo "\$ $a|$b bench -m $model -p 0 -n 32 -r 1 $*"
ratios=()
for i in $(seq "$pairs"); do
  if [ $((i % 2)) = 1 ]; then ta=$(run "$a" "$@"); tb=$(run "$b" "$@"); else tb=$(run "$b" "$@"); ta=$(run "$a" "$@"); fi
  r=$(awk -v a="$ta" -v b="$tb" 'BEGIN { printf "%.3f", b / a }')
  ratios+=("$r")
  echo "pair $i: A $ta t/s, B $tb t/s, B/A $r"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END {
  printf "median B/A %.3f (min %.3f, max %.3f, %d pairs)\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR], NR }'
