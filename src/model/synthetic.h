// kite/src/model/synthetic.h — real model shapes with random weights, for benchmarks that need
// no large files. The same model can be written as GGUF so llama.cpp runs the very same bytes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/memory_source.h"

namespace kite {

struct SyntheticShape {
  std::string name;  // "llama-1b"
  int64_t n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff;
  float rope_theta;
};

// llama-1b (Llama-3.2-1B), llama-3b (Llama-3.2-3B), llama-8b (Llama-3-8B), vocabulary 32000;
// plus "tiny" for tests.
const std::vector<SyntheticShape>& synthetic_shapes();

// Builds the model with every matrix in `type` (norms F32) and a placeholder SPM vocabulary.
// Rows are random N(0, 0.02) values quantized once and repeated (speed does not depend on the
// values, and quantizing billions of weights would dominate the benchmark's start-up).
Result<std::unique_ptr<MemorySource>> make_synthetic(std::string_view shape, quant::Type type, uint64_t seed = 1);

}  // namespace kite
