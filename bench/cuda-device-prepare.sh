#!/usr/bin/env bash
# Prepares what bench/cuda-device.sh needs on a lent GPU machine, HERE (no GPU needed), into
# build-gpu-carry/ (ignored by git, under the 64 MiB the device tool carries with the tree):
#   kite-bin.tar.xz  bin/: kite, kite-tests, kite-cuda-bandwidth, kite-cuda-matmul from
#                build-cuda (KITE_CUDA=ON, sm_90), stripped: the device image has CMake, ninja
#                and nvcc but not the Debian packages kite builds against (nlohmann-json,
#                CLI11, doctest, cpp-httplib);
#                lib/: the shared libraries they need beyond glibc/libstdc++ and CUDA's own.
#                Each binary holds the same ~15 MB of sm_90 kernels: one xz stream with a 64 MiB
#                dictionary (-9, one thread) stores them once (22 MB at -6 -T0, 10 MB so)
#   testdata.tar.xz  the GGUF test files and heldout.txt (the GPU tests), compressed (49 -> 35 MB)
#   or, with WITH_LLAMA=1, instead of the test data:
#   llama-cuda.tar.xz  llama.cpp's CUDA build (llama-bench, llama-batched-bench and their
#                libraries), stripped, from LLAMA_CUDA_BUILD (default /tmp/llama.cpp/build-cuda):
#                `bench/build-llama-cpp.sh --cuda` makes it (sm_90 only; about 1h45 on 2 cores,
#                so it is built once and kept). Every run of this script that finds that build
#                newer than build-llama-cuda/llama-cuda.tar.xz archives it there (ignored by git,
#                and kept where /tmp is not), and WITH_LLAMA=1 carries that archive: a later
#                session needs no llama.cpp build of its own. It is about 41 MB compressed: with the test data
#                the carry would pass 64 MiB, so a GPU session runs the device script twice, once
#                prepared each way (the llama.cpp comparison first: it is the issue's headline),
#                or once with the tests only.
#   libvulkan1.deb  Debian's Vulkan loader, for the Vulkan steps where the device image lacks one
#   paths.env    the paths compiled into kite-tests (testdata, kite binary, build folder)
# Then, with the device tool:  run  command="bash bench/cuda-device.sh"  carry=["build-gpu-carry"]  timeout_s=540
# The test data is all of ../shared/testdata/gguf: the GPU perplexity test reads every file that
# peer-reference.json lists (all of them), and the greedy tests the F16 ones.
#   bench/cuda-device-prepare.sh [BUILD_DIR=build-cuda]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-cuda}"
carry=build-gpu-carry
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKITE_CUDA=ON -DKITE_VULKAN=ON -DKITE_CUDA_ARCHITECTURES=90
fi
grep -q '^KITE_CUDA:BOOL=ON' "$build/CMakeCache.txt" || { echo "$build is not a KITE_CUDA=ON build" >&2; exit 1; }
grep -q '^KITE_VULKAN:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "$build is not a KITE_VULKAN=ON build (cmake -DKITE_VULKAN=ON $build)" >&2; exit 1; }
grep -q '^KITE_CUDA_ARCHITECTURES:STRING=90$' "$build/CMakeCache.txt" ||
  echo "warning: $build is not built for sm_90 only (bigger binaries)" >&2
nice cmake --build "$build" --target kite kite-tests kite-cuda-bandwidth kite-cuda-matmul -j"${JOBS:-2}"

rm -rf "$carry"
stage="$(mktemp -d)"
mkdir -p "$stage/bin" "$stage/lib" "$carry"
for exe in "$build/tools/kite" "$build/tests/kite-tests" "$build/bench/kite-cuda-bandwidth" "$build/bench/kite-cuda-matmul"; do
  strip -o "$stage/bin/$(basename "$exe")" "$exe"
done
# Libraries beyond the C/C++ runtime and CUDA's (which the device image has).
ldd "$build/tools/kite" "$build/tests/kite-tests" | awk '/=>/ {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64|libpthread|libdl|librt|libcuda|libcudart|libcublas|libcublasLt)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
tar -C "$stage" -cf - bin lib | xz -9 -T1 >"$carry/kite-bin.tar.xz"
rm -rf "$stage"

src="$(sed -n 's/^KITE_TESTDATA_DIR:PATH=//p' "$build/CMakeCache.txt")"
if [ "${WITH_LLAMA:-0}" != 1 ]; then
  (cd "$src" && tar -cf - gguf/*.gguf gguf/peer-reference.json heldout.txt) | xz -T0 -6 >"$carry/testdata.tar.xz"
fi

(cd "$carry" && apt-get download libvulkan1 >/dev/null 2>&1 && mv libvulkan1_*.deb libvulkan1.deb) ||
  echo "could not download libvulkan1 (apt): the device run's Vulkan steps need the image's loader" >&2

llama="${LLAMA_CUDA_BUILD:-/tmp/llama.cpp/build-cuda}"
cache=build-llama-cuda/llama-cuda.tar.xz
if [ -x "$llama/bin/llama-bench" ] && [ -x "$llama/bin/llama-batched-bench" ] &&
  { [ ! -f "$cache" ] || [ "$llama/bin/llama-bench" -nt "$cache" ]; }; then
  stage="$(mktemp -d)"
  mkdir -p "$stage/llama" "$(dirname "$cache")"
  for exe in llama-bench llama-batched-bench; do strip -o "$stage/llama/$exe" "$llama/bin/$exe"; done
  ldd "$llama/bin/llama-bench" "$llama/bin/llama-batched-bench" | awk '/=>/ {print $3}' | sort -u |
    grep -F "$llama" | while read -r lib; do strip -o "$stage/llama/$(basename "$lib")" "$lib"; done
  tar -C "$stage" -cf - llama | xz -9 -T1 >"$cache.tmp" && mv "$cache.tmp" "$cache"
  rm -rf "$stage"
  src_dir="$(cd "$llama/.." && pwd)"
  echo "llama.cpp $(git -C "$src_dir" rev-parse --short HEAD 2>/dev/null || echo '?') from $llama" >"$cache.txt"
fi
if [ "${WITH_LLAMA:-0}" != 1 ]; then
  echo "llama.cpp's CUDA build left out (WITH_LLAMA=1 carries it instead of the test data)" >&2
elif [ -f "$cache" ]; then
  cp "$cache" "$carry/llama-cuda.tar.xz"
  echo "carrying $(cat "$cache.txt" 2>/dev/null || echo "$cache")" >&2
else
  echo "no llama.cpp CUDA build in $llama nor $cache (bench/build-llama-cpp.sh --cuda): the device run will have no llama.cpp columns" >&2
fi
{
  echo "KITE_TESTDATA_DIR=$src"
  echo "KITE_EXE=$(cd "$build" && pwd)/tools/kite"
  echo "KITE_BINARY_DIR=$(cd "$build" && pwd)"
} >"$carry/paths.env"
du -sh "$carry" "$carry"/*
total=$(( $(du -sb "$carry" | cut -f1) + $(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) ))
echo "carried with the tree: about $((total / 1048576)) MiB of 64 MiB"
[ "$total" -lt $((64 * 1048576)) ] || { echo "over the device tool's 64 MiB: trim $carry" >&2; exit 1; }
