// kite/tests/gemma_model.h — a gemma3 test model made from a trained qwen3 one.
//
// The shared test data has no gemma model. qwen3 already has gemma3's per-head Q/K norms and
// neox rope, so a qwen3 file becomes a gemma3 one that still says what the trained model says:
// the embedding divided by sqrt(n_embd) (gemma3 multiplies it back; a tied LM head gets the factor
// back through output_norm), the FFN gate divided and its up projection multiplied by 1.702
// (gelu(x / 1.702) * 1.702 is close to silu(x)), and the norms gemma3 adds after attention and
// after the FFN set to constant weights. What differs from the trained model: those norms, a short
// sliding window on every other layer (so a 256-token text crosses it) and linear rope scaling on
// the others. Deterministic: llama.cpp's numbers for the file can be kept (tests/data/README.md;
// tests/data/make_model.cpp is the command line).
#pragma once

#include <cstdint>
#include <string>

#include "src/base/status.h"

namespace kite::test {

struct GemmaFromQwen3 {
  int32_t window = 48;            // attention.sliding_window
  int32_t pattern = 2;            // attention.sliding_window_pattern: layers 0, 2, ... slide
  float rope_linear = 2.f;        // the global layers' rope.scaling.factor
  float attn_post_norm = 0.15f;    // post_attention_norm's weights
  float ffn_post_norm = 0.15f;     // post_ffw_norm's weights
};

Status gemma3_from_qwen3(const std::string& qwen3_gguf, const std::string& out_gguf, const GemmaFromQwen3& o = {});

// (kite-tests only, test_gemma.cpp.) tests/data/gemma-reference.json, and its test model
// "gemma3-tiny.gguf" made once per process (moe_model.h's derived_test_file).
std::string gemma_reference_path();
std::string gemma_test_file();

}  // namespace kite::test
