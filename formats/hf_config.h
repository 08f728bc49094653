// kite/formats/hf_config.h — Hugging Face config.json -> hyperparameters under GGUF keys.
//
// Supported: LlamaForCausalLM, MistralForCausalLM (presented as "llama", as llama.cpp does),
// Qwen2ForCausalLM, Qwen3ForCausalLM. The metadata written by add_config_metadata() uses the
// keys, value types (u32 counts, f32 eps/freq) and conventions of llama.cpp's
// convert_hf_to_gguf.py, so model code reads an HF folder and a GGUF file the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf.h"
#include "src/base/status.h"

namespace kite::hf {

// rope_scaling / rope_parameters beyond the plain rope. `type` is "none" when absent or
// "default"; otherwise "linear", "llama3" or "yarn" (others are rejected, except "dynamic",
// which only matters past the trained context and is kept as type "dynamic" with no GGUF keys).
struct RopeScaling {
  std::string type = "none";
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0 = not given
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // yarn (nullopt = not given, the model uses its defaults)
  std::optional<double> beta_fast, beta_slow, attention_factor, ext_factor;
};

struct Config {
  std::string hf_architecture;  // "LlamaForCausalLM", ...
  std::string model_type;       // "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral"
  std::string arch;             // GGUF general.architecture: "llama", "qwen2", "qwen3", "qwen3moe", "gemma2", ...

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  bool head_dim_explicit = false;   // config.json gave head_dim
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v(/o) biases: the flag, or always for qwen2
  bool mlp_bias = false;
  std::optional<int64_t> sliding_window;  // set only when sliding-window attention is in use
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // config.json's eos_token_id (an int or a list)
  std::optional<int64_t> pad_token_id;
  std::string torch_dtype;  // "bfloat16", "float16", ... ("" if absent)
  // Mixture of experts (Qwen3MoeForCausalLM: num_experts, moe_intermediate_size;
  // MixtralForCausalLM: num_local_experts, intermediate_size): 0 experts for a dense model.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  // Gemma2ForCausalLM, Gemma3ForCausalLM and Gemma3ForConditionalGeneration's text model
  // (text_config, transformers' defaults for what it leaves out).
  struct Gemma {
    int64_t sliding_window = 0;         // 0: no sliding layers
    int64_t pattern = 0;                // every pattern-th layer global (sliding_window_pattern)
    std::vector<bool> sliding_layers;   // or a flag per layer (layer_types)
    std::optional<double> rope_local_base;  // gemma3: the sliding layers' rope base
    double attn_softcap = 0, final_softcap = 0;  // 0: none
  } gemma;
};

// Architectures kite can load from an HF folder, for error messages: "LlamaForCausalLM, ...".
std::string supported_architectures();

// Parses config.json text; `source` (the file path) is used in messages.
Result<Config> parse_config(std::string_view json_text, const std::string& source);
Result<Config> load_config(const std::string& config_json_path);

// Writes general.architecture, general.name and the {arch}.* hyperparameter keys.
void add_config_metadata(const Config& config, std::string_view model_name, gguf::Metadata& out);

// llama3 rope scaling: llama.cpp stores the per-frequency factors as a tensor
// `rope_freqs.weight` (f32, head_dim / 2 values) instead of metadata. Empty for other types.
std::vector<float> llama3_rope_factors(const Config& config);

}  // namespace kite::hf
