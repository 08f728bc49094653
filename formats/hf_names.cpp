#include "formats/hf_names.h"

#include <cstdint>

#include "formats/safetensors.h"

namespace kite::hf {
namespace {

struct NameRow {
  std::string_view hf;    // after "model.layers.N." for per-layer rows
  std::string_view gguf;  // after "blk.N." for per-layer rows; empty = skip
};

// Whole-model tensors, shared by every supported architecture.
constexpr NameRow kGlobal[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
    {"model.rotary_emb.inv_freq", ""},
};

// Per-layer tensors of the llama family (llama, mistral, qwen2). Biases appear only where the
// config asks for them (qwen2 always has q/k/v biases).
constexpr NameRow kLlamaLayer[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate_proj.bias", "ffn_gate.bias"},
    {"mlp.up_proj.bias", "ffn_up.bias"},
    {"mlp.down_proj.bias", "ffn_down.bias"},
    {"self_attn.rotary_emb.inv_freq", ""},
};

// Qwen3: the llama layer plus per-head RMS norms on Q and K.
constexpr NameRow kQwen3Extra[] = {
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
};

constexpr std::string_view kLayerPrefix = "model.layers.";

const NameRow* find_row(std::string_view arch, std::string_view rest) {
  for (const NameRow& r : kLlamaLayer)
    if (r.hf == rest) return &r;
  if (arch == "qwen3")
    for (const NameRow& r : kQwen3Extra)
      if (r.hf == rest) return &r;
  return nullptr;
}

}  // namespace

Result<std::optional<std::string>> gguf_tensor_name(std::string_view arch, std::string_view hf_name) {
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3")
    return make_error("no tensor name table for architecture '", safetensors::printable(arch, 40), "'");
  for (const NameRow& r : kGlobal)
    if (r.hf == hf_name)
      return r.gguf.empty() ? std::optional<std::string>() : std::optional<std::string>(std::string(r.gguf));

  if (hf_name.substr(0, kLayerPrefix.size()) == kLayerPrefix) {
    std::string_view rest = hf_name.substr(kLayerPrefix.size());
    size_t digits = 0;
    uint64_t layer = 0;
    while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9' && digits < 9) {
      layer = layer * 10 + static_cast<uint64_t>(rest[digits] - '0');
      ++digits;
    }
    const bool canonical = digits > 0 && (digits == 1 || rest[0] != '0');
    if (canonical && digits < rest.size() && rest[digits] == '.') {
      if (const NameRow* r = find_row(arch, rest.substr(digits + 1))) {
        if (r->gguf.empty()) return std::optional<std::string>();
        return std::optional<std::string>("blk." + std::to_string(layer) + "." + std::string(r->gguf));
      }
    }
  }
  return make_error("tensor '", safetensors::printable(hf_name, 200), "' has no known GGUF name for architecture '",
                    arch, "'");
}

}  // namespace kite::hf
