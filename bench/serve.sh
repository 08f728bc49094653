#!/usr/bin/env bash
# kite serve against llama-server on the same GGUF, same threads, same run: throughput and p50/p99
# time-to-first-token and inter-token latency at concurrency 1, 8 and 32 (bench/serve-load.mjs;
# streaming /v1/completions, 16-token prompts as token ids, greedy, ignore_eos).
# Not run in CI. Needs llama.cpp built by bench/build-llama-cpp.sh (target llama-server).
#   bench/serve.sh [FILE=/tmp/kite-bench/llama-1b-Q4_K_M.gguf] [CONC="1 8 32"] [MAX_TOKENS=32]
# Environment: THREADS (default nproc), ROUNDS (requests per client, default 2: the first round
# arrives as one burst on an idle server, later rounds show the steady state), KITE_ARGS (extra
# `kite serve` flags, e.g. "--prefill-chunk 0" for the old policy), TRACE_DIR (per-request
# timelines from serve-load.mjs, NAME-CONC.trace), PORT (llama-server's; kite's is PORT + 1),
# LOG_DIR (where the two servers' logs go, default /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
file="${1:-/tmp/kite-bench/llama-1b-Q4_K_M.gguf}"
concs="${2:-1 8 32}"
n="${3:-32}"
llama="${LLAMA_CPP_DIR:-/tmp/llama.cpp}/build/bin"
kite="${KITE:-build/tools/kite}"
threads="${THREADS:-$(nproc)}"
rounds="${ROUNDS:-2}"
p1="${PORT:-18081}"   # llama-server on PORT, kite on PORT + 1
p2=$(( p1 + 1 ))
par=32
ctx=$(( par * (16 + n + 8) ))
wait_ready() {  # URL PID
  for _ in $(seq 600); do
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}
run_load() {  # NAME URL
  for c in $concs; do
    printf '%-12s ' "$1"
    reqs=$(( c * rounds > 4 ? c * rounds : 4 ))
    if [ -n "${TRACE_DIR:-}" ]; then
      SERVE_LOAD_TRACE="$TRACE_DIR/$1-$c.trace" node bench/serve-load.mjs "$2" "$c" "$reqs" "$n" 16
    else
      node bench/serve-load.mjs "$2" "$c" "$reqs" "$n" 16
    fi
  done
}
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads, $file"
echo "\$ llama-server -m $file -t $threads -np $par -c $ctx --port $p1"
"$llama/llama-server" -m "$file" -t "$threads" -np "$par" -c "$ctx" --port $p1 >"${LOG_DIR:-/tmp}/llama-server.log" 2>&1 &
pid=$!
wait_ready http://127.0.0.1:$p1 $pid && run_load llama-server http://127.0.0.1:$p1
kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true
echo "\$ kite serve -m $file -t $threads --parallel $par -c $(( 16 + n + 8 )) --port $p2 ${KITE_ARGS:-}"
# shellcheck disable=SC2086
"$kite" serve -m "$file" -t "$threads" --parallel "$par" -c $(( 16 + n + 8 )) --port $p2 ${KITE_ARGS:-} \
  >"${LOG_DIR:-/tmp}/kite-serve.log" 2>&1 &
pid=$!
wait_ready http://127.0.0.1:$p2 $pid && run_load kite http://127.0.0.1:$p2
kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true
