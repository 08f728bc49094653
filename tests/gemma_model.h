// kite/tests/gemma_model.h — gemma2 and gemma3 test models made from trained dense ones.
//
// The shared test data has no gemma model. qwen3 already has gemma3's per-head Q/K norms and
// neox rope, and llama (its Q/K rows put back in neox order) has gemma2's attention, so they
// become gemma files that still run as language models: the embedding divided by sqrt(n_embd)
// (gemma multiplies it back; the tied LM head gets the factor back through output_norm), the FFN
// gate divided and its up projection multiplied by 1.702 (gelu(x / 1.702) * 1.702 is close to
// silu(x)), and the norms gemma adds after attention and after the FFN set to constant weights.
// What differs from the trained model: those norms, a short sliding window on every other layer
// (so a 256-token text crosses it), linear rope scaling on the others (gemma3) and soft-capped
// scores and logits (gemma2). Deterministic: llama.cpp's numbers for the files can be kept
// (tests/data/README.md; tests/data/make_model.cpp is the command line).
#pragma once

#include <cstdint>
#include <string>

#include "src/base/status.h"

namespace kite::test {

struct GemmaOptions {
  std::string arch = "gemma3";  // from qwen3; "gemma2": from llama
  int32_t window = 48;          // attention.sliding_window
  int32_t pattern = 2;          // attention.sliding_window_pattern: layers 0, 2, ... slide
  float rope_linear = 2.f;      // gemma3: the global layers' rope.scaling.factor
  float post_norm = 0.15f;      // post_attention_norm's and post_ffw_norm's weights
  float attn_softcap = 5.f;    // gemma2: attn_logit_softcapping
  float final_softcap = 10.f;   // gemma2: final_logit_softcapping
};

Status make_gemma(const std::string& dense_gguf, const std::string& out_gguf, const GemmaOptions& o = {});

// A Hugging Face folder holding the same model as `gemma_gguf` (a file make_gemma made):
// Gemma2ForCausalLM or Gemma3ForCausalLM (with `multimodal`, Gemma3ForConditionalGeneration:
// the text model under text_config and language_model.model.*, beside a vision tensor), norms
// stored as Gemma's (weight - 1), `dense_hf`'s tokenizer files.
Status gemma_gguf_to_hf(const std::string& gemma_gguf, const std::string& dense_hf, const std::string& out_dir,
                        bool multimodal = false);

// (kite-tests only, test_gemma.cpp.) tests/data/gemma-reference.json, and its test model `name`
// ("gemma3-tiny.gguf", "gemma2-tiny.gguf") made once per process (moe_model.h's derived_test_file).
std::string gemma_reference_path();
std::string gemma_test_file(const std::string& name);

}  // namespace kite::test
