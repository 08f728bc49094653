#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for SECONDS (default 60),
# seeded from tests/fuzz/seeds and every saved regression input. A crash leaves its input in
# build-fuzz/crashes/<target>/: fix the bug, then keep the input under
# tests/fuzz/regressions/<format>/ so the regression test replays it forever.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on paths relative to the checkout, so clones in other folders share the cache.
export CCACHE_BASEDIR="$PWD"
seconds="${1:-60}"
build="${KITE_FUZZ_BUILD_DIR:-build-fuzz}"
# The fuzzers exercise the file parsers: no GPU backend (nvcc would get clang's sanitizer flags).
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKITE_FUZZ=ON \
  -DKITE_CUDA=OFF -DKITE_NCCL=OFF >/dev/null
status=0
for format in gguf safetensors; do
  target="fuzz_$format"
  [ -f "tests/fuzz/$target.cpp" ] || continue
  cmake --build "$build" --target "$target" -j "$(nproc)"
  corpus="$build/corpus/$format"
  crashes="$build/crashes/$format"
  mkdir -p "$corpus" "$crashes"
  cp -n tests/fuzz/seeds/"$format"/* tests/fuzz/regressions/"$format"/* "$corpus"/ 2>/dev/null || true
  echo "fuzz: $target for ${seconds}s" >&2
  if ! "$build/tests/fuzz/$target" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="$crashes/" -print_final_stats=1 "$corpus" 2>"$build/$target.log"; then
    echo "fuzz: $target FAILED; input saved in $crashes; log $build/$target.log" >&2
    tail -40 "$build/$target.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|Done" "$build/$target.log" | tail -2 >&2 || true
  fi
done
exit $status
