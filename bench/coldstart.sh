#!/usr/bin/env bash
# Cold start and memory: kite run against llama.cpp's llama-simple on the same GGUF, same threads,
# alternated: wall time from exec to the first generated token (-n 1, page cache dropped before
# each run when we may write /proc/sys/vm/drop_caches, i.e. as root; warm otherwise) and peak RSS
# (GNU time's %M), against the file size. Issue #4's goals: cold TTFT <= llama.cpp's and peak
# RSS <= file + KV + 10%. Not run in CI. Needs llama.cpp built by bench/build-llama-cpp.sh
# (target llama-simple) and /usr/bin/time.
#   bench/coldstart.sh [FILES="/tmp/kite-bench/llama-1b-Q4_K_M.gguf ..."] [REPS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
files="${1:-/tmp/kite-bench/llama-1b-Q4_K_M.gguf /tmp/kite-bench/llama-1b-Q4_0.gguf /tmp/kite-bench/llama-1b-Q8_0.gguf}"
reps="${2:-3}"
llama="${LLAMA_CPP_DIR:-/tmp/llama.cpp}/build/bin"
kite="${KITE:-build/tools/kite}"
threads="${THREADS:-$(nproc)}"
prompt="Once upon a time"
ctx=256
cold=warm
if [ -w /proc/sys/vm/drop_caches ]; then cold=cold; fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
one() {  # label file cmd...
  local label="$1" file="$2"
  shift 2
  if [ "$cold" = cold ]; then sync; echo 3 >/proc/sys/vm/drop_caches; fi
  /usr/bin/time -o "$out/time" -f "%e %M" "$@" >/dev/null 2>"$out/err" || { cat "$out/err" >&2; return 1; }
  read -r wall rss <"$out/time"
  echo "$wall" >>"$out/$label.wall"
  echo "$rss" >>"$out/$label.rss"
}
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads, $cold page cache, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "\$ kite run -m FILE -p '$prompt' -n 1 -t $threads -c $ctx"
echo "\$ llama-simple -m FILE -n 1 '$prompt'   (its context is the prompt plus n)"
echo
echo "| file | size MiB | kite s | llama.cpp s | kite/llama.cpp | kite RSS MiB | llama.cpp RSS MiB | kite RSS / size |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for f in $files; do
  rm -f "$out"/*.wall "$out"/*.rss
  for _ in $(seq "$reps"); do
    one kite "$f" "$kite" run -m "$f" -p "$prompt" -n 1 -t "$threads" -c "$ctx"
    one llama "$f" "$llama/llama-simple" -m "$f" -n 1 "$prompt"
  done
  size=$(( $(stat -c %s "$f") / 1048576 ))
  kw=$(median <"$out/kite.wall"); lw=$(median <"$out/llama.wall")
  kr=$(( $(median <"$out/kite.rss") / 1024 )); lr=$(( $(median <"$out/llama.rss") / 1024 ))
  echo "| $(basename "$f") | $size | $kw | $lw | $(awk -v a="$kw" -v b="$lw" 'BEGIN{printf "%.2f", a / b}') | $kr | $lr | $(awk -v a="$kr" -v b="$size" 'BEGIN{printf "%.3f", a / b}') |"
done
