#!/usr/bin/env bash
# Prepares what bench/cuda-device.sh needs on a lent GPU machine, HERE (no GPU needed), into
# build-gpu-carry/ (ignored by git, under the 64 MiB the device tool carries with the tree):
#   kite-bin.tar.xz  bin/: kite, kite-tests, kite-cuda-bandwidth from build-cuda (KITE_CUDA=ON,
#                sm_90), stripped: the device image has CMake, ninja and nvcc but not the Debian
#                packages kite builds against (nlohmann-json, CLI11, doctest, cpp-httplib);
#                lib/: the shared libraries they need beyond glibc/libstdc++ and CUDA's own
#   testdata/    the GGUF test files and heldout.txt (the GPU tests)
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
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKITE_CUDA=ON -DKITE_CUDA_ARCHITECTURES=90
fi
grep -q '^KITE_CUDA:BOOL=ON' "$build/CMakeCache.txt" || { echo "$build is not a KITE_CUDA=ON build" >&2; exit 1; }
grep -q '^KITE_CUDA_ARCHITECTURES:STRING=90$' "$build/CMakeCache.txt" ||
  echo "warning: $build is not built for sm_90 only (bigger binaries)" >&2
nice cmake --build "$build" --target kite kite-tests kite-cuda-bandwidth -j"${JOBS:-2}"

rm -rf "$carry"
stage="$(mktemp -d)"
mkdir -p "$stage/bin" "$stage/lib" "$carry/testdata/gguf"
for exe in "$build/tools/kite" "$build/tests/kite-tests" "$build/bench/kite-cuda-bandwidth"; do
  strip -o "$stage/bin/$(basename "$exe")" "$exe"
done
# Libraries beyond the C/C++ runtime and CUDA's (which the device image has).
ldd "$build/tools/kite" "$build/tests/kite-tests" | awk '/=>/ {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64|libpthread|libdl|librt|libcuda|libcudart|libcublas|libcublasLt)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
tar -C "$stage" -cJf "$carry/kite-bin.tar.xz" bin lib
rm -rf "$stage"

src="$(sed -n 's/^KITE_TESTDATA_DIR:PATH=//p' "$build/CMakeCache.txt")"
cp "$src"/gguf/*.gguf "$src"/gguf/peer-reference.json "$carry/testdata/gguf/"
cp "$src"/heldout.txt "$carry/testdata/"
{
  echo "KITE_TESTDATA_DIR=$src"
  echo "KITE_EXE=$(cd "$build" && pwd)/tools/kite"
  echo "KITE_BINARY_DIR=$(cd "$build" && pwd)"
} >"$carry/paths.env"
du -sh "$carry" "$carry"/*
total=$(( $(du -sb "$carry" | cut -f1) + $(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) ))
echo "carried with the tree: about $((total / 1048576)) MiB of 64 MiB"
[ "$total" -lt $((64 * 1048576)) ] || { echo "over the device tool's 64 MiB: trim $carry" >&2; exit 1; }
