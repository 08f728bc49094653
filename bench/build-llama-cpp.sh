#!/usr/bin/env bash
# Builds llama.cpp (the peer for benchmarks) from the source the npm package node-llama-cpp
# ships, outside the repo. Not run in CI. Usage: bench/build-llama-cpp.sh [DIR] [TARGETS...]
# DIR defaults to $LLAMA_CPP_DIR or /tmp/llama.cpp; the binaries end up in DIR/build/bin.
set -euo pipefail
dir="${1:-${LLAMA_CPP_DIR:-/tmp/llama.cpp}}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(llama-bench llama-batched-bench llama-perplexity llama-server llama-tokenize llama-speculative-simple llama-quantize llama-simple)
version=3.22.1
if [ ! -d "$dir/.git" ]; then
  work=$(mktemp -d)
  (cd "$work" && npm pack "node-llama-cpp@$version" >/dev/null &&
    tar xzf "node-llama-cpp-$version.tgz" package/llama/gitRelease.bundle)
  git clone -q "$work/package/llama/gitRelease.bundle" "$dir"
  rm -rf "$work"
fi
cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON >/dev/null
cmake --build "$dir/build" -j "$(nproc)" --target "${targets[@]}"
echo "llama.cpp built in $dir/build/bin (commit $(git -C "$dir" rev-parse --short HEAD))" >&2
