#!/usr/bin/env bash
# Writes tests/data/moe-reference.json: llama.cpp's numbers for the mixture-of-experts test
# models (tests/moe_model.h), which tests/test_moe.cpp makes again and checks kite against, and
# tests/data/qwen3moe-tiny-imatrix.gguf: llama-imatrix's importance matrix of the qwen3moe one.
# Usage (llama.cpp built by bench/build-llama-cpp.sh, kite's tests built in build-cpu):
#   bash tests/data/make-moe-reference.sh [BUILD_DIR] [LLAMA_BIN] > tests/data/moe-reference.json
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cpu}
L=${2:-/tmp/llama.cpp/build/bin}
T=${KITE_TESTDATA:-../shared/testdata}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prompt="Prince Andrew looked at Pierre and said"
"$build/tests/kite-make-model" moe "$T/gguf/qwen3-tiny-f16.gguf" "$work/qwen3moe-tiny.gguf"
"$build/tests/kite-make-model" moe "$T/gguf/llama-draft-f16.gguf" "$work/llama-draft-moe.gguf"
imatrix=tests/data/qwen3moe-tiny-imatrix.gguf
"$L/llama-imatrix" -m "$work/qwen3moe-tiny.gguf" -f "$T/heldout.txt" -c 256 -o "$imatrix" >/dev/null 2>&1
"$L/llama-quantize" "$work/qwen3moe-tiny.gguf" "$work/qwen3moe-tiny-Q4_K_M.gguf" Q4_K_M 2 >/dev/null 2>&1
"$L/llama-quantize" --imatrix "$imatrix" "$work/qwen3moe-tiny.gguf" "$work/qwen3moe-tiny-IQ2_XS.gguf" IQ2_XS 2 \
  >/dev/null 2>&1
for f in qwen3moe-tiny llama-draft-moe qwen3moe-tiny-Q4_K_M qwen3moe-tiny-IQ2_XS; do
  "$L/llama-perplexity" -m "$work/$f.gguf" -f "$T/heldout.txt" -c 256 -b 256 2>&1 |
    sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' > "$work/$f.ppl"
  "$L/llama-simple" -m "$work/$f.gguf" -n 32 "$prompt" 2>/dev/null > "$work/$f.out"
done
# The JSON, with each file's size, FNV-1a 64 of its bytes, and for the quantized file every
# tensor's type read from the GGUF header (independently of kite).
python3 - "$work" "$prompt" <<'PY'
import json, os, struct, sys
work, prompt = sys.argv[1], sys.argv[2]
names = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 10: "q2_K", 11: "q3_K",
         12: "q4_K", 13: "q5_K", 14: "q6_K", 16: "iq2_xxs", 17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s", 20: "iq4_nl",
         21: "iq3_s", 22: "iq2_s", 23: "iq4_xs", 30: "bf16"}
def fnv(path):
    h = 0xcbf29ce484222325
    data = open(path, "rb").read()
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h
def tensor_types(path):
    f = open(path, "rb")
    magic, version, n_tensors, n_kv = struct.unpack("<IIQQ", f.read(24))
    def string():
        (n,) = struct.unpack("<Q", f.read(8)); return f.read(n).decode()
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    def value(t):
        if t == 8: string()
        elif t == 9:
            et, n = struct.unpack("<IQ", f.read(12))
            for _ in range(n): value(et)
        else: f.read(sizes[t])
    file_type = None
    for _ in range(n_kv):
        key = string(); (t,) = struct.unpack("<I", f.read(4))
        if key == "general.file_type": (file_type,) = struct.unpack("<I", f.read(4))
        else: value(t)
    types = {}
    for _ in range(n_tensors):
        name = string(); (nd,) = struct.unpack("<I", f.read(4)); f.read(8 * nd)
        (t,) = struct.unpack("<I", f.read(4)); f.read(8)
        types[name] = names[t]
    return file_type, types
out = {}
sources = {"qwen3moe-tiny": "gguf/qwen3-tiny-f16.gguf", "llama-draft-moe": "gguf/llama-draft-f16.gguf"}
for f in ["qwen3moe-tiny", "llama-draft-moe", "qwen3moe-tiny-Q4_K_M", "qwen3moe-tiny-IQ2_XS"]:
    p = os.path.join(work, f + ".gguf")
    e = {"bytes": os.path.getsize(p), "ppl_ctx256": float(open(os.path.join(work, f + ".ppl")).read()),
         "greedy32_prompt": prompt, "greedy32_output": open(os.path.join(work, f + ".out")).read()}
    if f in sources:
        e["upcycled_from"] = sources[f]; e["fnv1a64"] = fnv(p)
    else:
        e["file_type"], e["tensor_types"] = tensor_types(p)
    out[f + ".gguf"] = e
json.dump(out, sys.stdout, indent=1, ensure_ascii=True)
print()
PY
