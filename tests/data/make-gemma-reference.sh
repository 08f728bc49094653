#!/usr/bin/env bash
# Writes tests/data/gemma-reference.json: llama.cpp's numbers for the gemma2 and gemma3 test
# models (tests/gemma_model.h), which tests/test_gemma.cpp makes again and checks kite against.
# Usage (llama.cpp built by bench/build-llama-cpp.sh, kite's tests built in build-cpu):
#   bash tests/data/make-gemma-reference.sh [BUILD_DIR] [LLAMA_BIN] > tests/data/gemma-reference.json
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cpu}
L=${2:-/tmp/llama.cpp/build/bin}
T=${KITE_TESTDATA:-../shared/testdata}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prompt="Prince Andrew looked at Pierre and said"
"$build/tests/kite-make-model" gemma3 "$T/gguf/qwen3-tiny-f16.gguf" "$work/gemma3-tiny.gguf"
"$build/tests/kite-make-model" gemma2 "$T/gguf/llama-draft-f16.gguf" "$work/gemma2-tiny.gguf"
"$L/llama-quantize" "$work/gemma3-tiny.gguf" "$work/gemma3-tiny-Q4_K_M.gguf" Q4_K_M 2 >/dev/null 2>&1
for f in gemma3-tiny gemma2-tiny gemma3-tiny-Q4_K_M; do
  "$L/llama-perplexity" -m "$work/$f.gguf" -f "$T/heldout.txt" -c 256 -b 256 2>&1 |
    sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' > "$work/$f.ppl"
  "$L/llama-simple" -m "$work/$f.gguf" -n 32 "$prompt" 2>/dev/null > "$work/$f.out"
done
python3 - "$work" "$prompt" <<'PY'
import json, os, sys
work, prompt = sys.argv[1], sys.argv[2]
def fnv(path):
    h = 0xcbf29ce484222325
    for b in open(path, "rb").read():
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h
out = {}
sources = {"gemma3-tiny": "gguf/qwen3-tiny-f16.gguf", "gemma2-tiny": "gguf/llama-draft-f16.gguf"}
for f in ["gemma3-tiny", "gemma2-tiny", "gemma3-tiny-Q4_K_M"]:
    p = os.path.join(work, f + ".gguf")
    e = {"bytes": os.path.getsize(p), "ppl_ctx256": float(open(os.path.join(work, f + ".ppl")).read()),
         "greedy32_prompt": prompt, "greedy32_output": open(os.path.join(work, f + ".out")).read()}
    if f in sources:
        e["made_from"] = sources[f]; e["fnv1a64"] = fnv(p)
    out[f + ".gguf"] = e
json.dump(out, sys.stdout, indent=1, ensure_ascii=True)
print()
PY
