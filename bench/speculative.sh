#!/usr/bin/env bash
# Speculative decoding: kite (kite run --spec ...) against llama.cpp's llama-speculative-simple
# on the same GGUF files, same threads, in the same run, with and without speculation, REPS
# repetitions back to back (medians printed at the end), then where speculation stops paying as
# concurrency grows (kite bench --parallel with and without --spec).
# Not run in CI. Needs llama.cpp built by bench/build-llama-cpp.sh (target
# llama-speculative-simple and llama-bench).
# Last, where decode is closer to memory-bound: plain against --spec ngram on Llama-1B shapes
# with random weights (SYNTH, default /tmp/kite-bench/llama-1b-Q4_K_M.gguf, made by
# `kite bench --synthetic llama-1b --type f16 --write-gguf` + llama-quantize; skipped when
# missing). Its greedy output falls into a loop within a few tokens: a repetitive continuation.
#   bench/speculative.sh [N=128] [REPS=3]     env: THREADS, KITE, LLAMA_CPP_DIR, TESTDATA, NPL, SYNTH
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-128}"
reps="${2:-3}"
td="${TESTDATA:-../shared/testdata}"
llama="${LLAMA_CPP_DIR:-/tmp/llama.cpp}/build/bin"
kite="${KITE:-build/tools/kite}"
threads="${THREADS:-$(nproc)}"
npl="${NPL:-1,4,16}"
target="$td/gguf/llama-target-Q4_K_M.gguf"
drafts=("$td/gguf/llama-draft-f16.gguf" "$td/gguf/llama-draft-Q4_K_M.gguf")
story=$'ROMEO:\nBut, soft! what light through yonder window breaks?'
# A repetitive continuation: a paragraph quoted twice, then its start again, so the continuation
# is a copy (as far as a 16M-parameter model copies: it drifts after a few lines).
para="$(awk 'BEGIN{RS=""} NR==40{print; exit}' "$td/heldout.txt")"
repeat="${para}"$'\n\n'"${para}"$'\n\n'"$(head -c 60 <<<"$para")"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# "kite run" prints "generated N tokens in T s (X t/s)" and the acceptance line on stderr.
kite_run() {  # label, prompt, extra flags...
  local label="$1" prompt="$2"
  shift 2
  "$kite" run -m "$target" -p "$prompt" -n "$n" --temp 0 --ignore-eos -t "$threads" -c 1024 "$@" >/dev/null 2>"$out/err"
  local ts acc
  ts="$(grep -oE 'generated [0-9]+ tokens in [0-9.]+ s \([0-9.]+ t/s\)' "$out/err" | grep -oE '[0-9.]+ t/s' | cut -d' ' -f1 || true)" 
  acc="$(grep -oE 'accepted [0-9]+ \([0-9.]+%\)' "$out/err" | grep -oE '[0-9.]+%' || echo -)"
  echo "$label|$ts|$acc" | tee -a "$out/rows"
}
llama_spec() {  # label, prompt, flags...
  local label="$1" prompt="$2"
  shift 2
  "$llama/llama-speculative-simple" -m "$target" -p "$prompt" -n "$n" --temp 0 -t "$threads" -c 1024 "$@" \
    >/dev/null 2>"$out/err" || true
  local ts acc
  ts="$(grep -oE 'decoded +[0-9]+ tokens in +[0-9.]+ seconds, speed: +[0-9.]+' "$out/err" | awk '{print $NF}' || true)"
  acc="$(grep -oE 'accept += +[0-9.]+%' "$out/err" | awk '{print $NF}' || true)"
  echo "$label|$ts|$acc" | tee -a "$out/rows"
}
llama_plain() {
  local ts
  ts="$("$llama/llama-bench" -m "$target" -p 0 -n "$n" -t "$threads" -r 1 -o csv 2>/dev/null | tail -1 | awk -F, '{gsub(/"/,"",$(NF-1)); print $(NF-1)}')"
  echo "llama.cpp no speculation (llama-bench tg$n)|$ts|-" | tee -a "$out/rows"
}

echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# target $target, greedy, $n tokens, $reps repetitions back to back"
for rep in $(seq "$reps"); do
  echo "## repetition $rep"
  kite_run "kite no speculation (story)" "$story"
  llama_plain
  for d in "${drafts[@]}"; do
    dn="$(basename "$d" .gguf)"
    kite_run "kite --draft $dn (adaptive)" "$story" --draft "$d"
    kite_run "kite --draft $dn --draft-fixed --draft-max 8 --draft-p-min 0" "$story" --draft "$d" --draft-fixed --draft-max 8 --draft-p-min 0
    llama_spec "llama.cpp draft-simple $dn n-max 8" "$story" -md "$d" --spec-type draft-simple --spec-draft-n-max 8 -td "$threads"
  done
  # A pair that agrees: the target as its own draft (the policy must keep drafting).
  kite_run "kite --draft the target itself (adaptive)" "$story" --draft "$target"
  kite_run "kite no speculation (repeat)" "$repeat"
  kite_run "kite --spec ngram (repeat)" "$repeat" --spec ngram
  kite_run "kite --spec ngram --draft-fixed (repeat)" "$repeat" --spec ngram --draft-fixed
  llama_spec "llama.cpp ngram-simple (repeat)" "$repeat" --spec-type ngram-simple --spec-draft-n-max 8
  kite_run "kite no speculation (story, for ngram)" "$story"
  kite_run "kite --spec ngram (story)" "$story" --spec ngram
done

echo
echo "## medians (t/s | acceptance)"
python3 - "$out/rows" <<'EOF'
import statistics, sys, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    label, ts, acc = line.rstrip("\n").split("|")
    rows.setdefault(label, []).append((float(ts) if ts else float("nan"), acc))
print("| run | t/s (median) | all runs | acceptance |")
print("|---|---:|---|---:|")
for label, v in rows.items():
    ts = [x for x, _ in v if x == x]
    if not ts:
        continue
    print(f"| {label} | {statistics.median(ts):.1f} | {' '.join(f'{x:.1f}' for x in ts)} | {v[-1][1]} |")
EOF

synth="${SYNTH:-/tmp/kite-bench/llama-1b-Q4_K_M.gguf}"
if [[ -f "$synth" ]]; then
  echo
  echo "## Llama-1B shapes, random weights ($synth): kite bench --parallel 1 -p 32 -n $n, plain / --spec ngram alternated"
  for rep in $(seq "$reps"); do
    for mode in "" "--spec ngram"; do
      # shellcheck disable=SC2086
      "$kite" bench -m "$synth" --parallel 1 -p 32 -n "$n" -t "$threads" $mode 2>/dev/null | grep -E '^\|    1 ' |
        awk -F'|' -v m="${mode:-plain}" '{gsub(/ /,"",$8); gsub(/ /,"",$10); gsub(/ /,"",$11); print m ": S_TG " $8 " t/s" ($10 != "" ? ", drafted " $10 ", accepted " $11 : "")}'
    done
  done
fi

echo
echo "## concurrency: kite bench --parallel $npl, prompts cut from heldout.txt, greedy"
for mode in "" "--spec ngram" "--draft ${drafts[0]}"; do
  echo "\$ kite bench -m $target --parallel $npl -p 64 -n 64 -t $threads --text heldout.txt $mode"
  # shellcheck disable=SC2086
  "$kite" bench -m "$target" --parallel "$npl" -p 64 -n 64 -t "$threads" --text "$td/heldout.txt" $mode 2>/dev/null
done
