#!/usr/bin/env bash
# Builds llama.cpp (the peer for benchmarks) from the source the npm package node-llama-cpp
# ships, outside the repo. Not run in CI. Usage: bench/build-llama-cpp.sh [--cuda] [DIR] [TARGETS...]
# DIR defaults to $LLAMA_CPP_DIR or /tmp/llama.cpp; the binaries end up in DIR/build/bin, or with
# --cuda in DIR/build-cuda/bin: the CUDA build the device script carries to a lent H200
# (-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90, no -march=native: the device's CPU is another
# x86-64; niced, about 1h45 on 2 cores).
set -euo pipefail
cuda=0
if [ "${1:-}" = "--cuda" ]; then
  cuda=1
  shift
fi
dir="${1:-${LLAMA_CPP_DIR:-/tmp/llama.cpp}}"
shift || true
targets=("$@")
given=${#targets[@]}
[ "$given" -gt 0 ] || targets=(llama-bench llama-batched-bench llama-perplexity llama-server llama-tokenize llama-speculative-simple llama-quantize llama-simple)
version=3.22.1
if [ ! -d "$dir/.git" ]; then
  work=$(mktemp -d)
  (cd "$work" && npm pack "node-llama-cpp@$version" >/dev/null &&
    tar xzf "node-llama-cpp-$version.tgz" package/llama/gitRelease.bundle)
  git clone -q "$work/package/llama/gitRelease.bundle" "$dir"
  rm -rf "$work"
fi
if [ $cuda = 1 ]; then
  [ "$given" -gt 0 ] || targets=(llama-bench llama-batched-bench)
  cmake -S "$dir" -B "$dir/build-cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
    -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined >/dev/null  # libcuda.so.1 is the GPU driver's: absent here
  nice cmake --build "$dir/build-cuda" -j "$(nproc)" --target "${targets[@]}"
  echo "llama.cpp CUDA built in $dir/build-cuda/bin (commit $(git -C "$dir" rev-parse --short HEAD))" >&2
  exit 0
fi
cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON >/dev/null
cmake --build "$dir/build" -j "$(nproc)" --target "${targets[@]}"
echo "llama.cpp built in $dir/build/bin (commit $(git -C "$dir" rev-parse --short HEAD))" >&2
