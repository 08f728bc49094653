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

// Gemma2 and Gemma3 layers: norms after attention and the FFN too (Gemma's
// post_attention_layernorm is the attention output's norm), Q/K norms in Gemma3.
constexpr NameRow kGemmaLayer[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

// A Gemma3ForConditionalGeneration checkpoint's text model lives under one of these prefixes
// (transformers 4, 5); its vision tower and projector under the others, which kite skips.
constexpr std::string_view kTextPrefixes[] = {"language_model.model.", "model.language_model."};
constexpr std::string_view kVisionPrefixes[] = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                                "model.multi_modal_projector."};

// Mixture-of-experts routers: Qwen3-MoE's and Mixtral's (a llama checkpoint with experts).
constexpr NameRow kMoeRouters[] = {
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
};

// The experts' matrices, after "<prefix><expert>.": Qwen3-MoE's, then Mixtral's.
struct ExpertRow {
  std::string_view prefix, matrix, gguf;
};
constexpr ExpertRow kExpertRows[] = {
    {"mlp.experts.", "gate_proj.weight", "ffn_gate_exps.weight"},
    {"mlp.experts.", "up_proj.weight", "ffn_up_exps.weight"},
    {"mlp.experts.", "down_proj.weight", "ffn_down_exps.weight"},
    {"block_sparse_moe.experts.", "w1.weight", "ffn_gate_exps.weight"},
    {"block_sparse_moe.experts.", "w3.weight", "ffn_up_exps.weight"},
    {"block_sparse_moe.experts.", "w2.weight", "ffn_down_exps.weight"},
};

constexpr std::string_view kLayerPrefix = "model.layers.";

const NameRow* find_row(std::string_view arch, std::string_view rest) {
  if (arch == "gemma2" || arch == "gemma3") {
    for (const NameRow& r : kGemmaLayer)
      if (r.hf == rest) return &r;
    return nullptr;
  }
  for (const NameRow& r : kLlamaLayer)
    if (r.hf == rest) return &r;
  if (arch == "qwen3" || arch == "qwen3moe")
    for (const NameRow& r : kQwen3Extra)
      if (r.hf == rest) return &r;
  if (arch == "qwen3moe" || arch == "llama")
    for (const NameRow& r : kMoeRouters)
      if (r.hf == rest) return &r;
  return nullptr;
}

// A canonical decimal index at the start of `s` (no leading zeros, at most 9 digits) followed
// by '.': the index, and `s` past the dot.
std::optional<uint64_t> leading_index(std::string_view& s) {
  size_t digits = 0;
  uint64_t v = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9' && digits < 9) {
    v = v * 10 + static_cast<uint64_t>(s[digits] - '0');
    ++digits;
  }
  const bool canonical = digits > 0 && (digits == 1 || s[0] != '0');
  if (!canonical || digits >= s.size() || s[digits] != '.') return std::nullopt;
  s.remove_prefix(digits + 1);
  return v;
}

}  // namespace

std::optional<ExpertPiece> expert_piece(std::string_view arch, std::string_view hf_name) {
  if ((arch != "qwen3moe" && arch != "llama") || hf_name.substr(0, kLayerPrefix.size()) != kLayerPrefix)
    return std::nullopt;
  std::string_view rest = hf_name.substr(kLayerPrefix.size());
  const std::optional<uint64_t> layer = leading_index(rest);
  if (!layer) return std::nullopt;
  for (const ExpertRow& r : kExpertRows) {
    if (rest.substr(0, r.prefix.size()) != r.prefix) continue;
    std::string_view tail = rest.substr(r.prefix.size());
    const std::optional<uint64_t> expert = leading_index(tail);
    if (expert && tail == r.matrix)
      return ExpertPiece{"blk." + std::to_string(*layer) + "." + std::string(r.gguf), static_cast<int64_t>(*expert)};
  }
  return std::nullopt;
}

Result<std::optional<std::string>> gguf_tensor_name(std::string_view arch, std::string_view hf_name) {
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "qwen3moe" && arch != "gemma2" &&
      arch != "gemma3")
    return make_error("no tensor name table for architecture '", safetensors::printable(arch, 40), "'");
  std::string text_name;  // a multimodal gemma3's text tensor, as "model.<rest>"
  if (arch == "gemma3") {
    for (std::string_view p : kVisionPrefixes)
      if (hf_name.substr(0, p.size()) == p) return std::optional<std::string>();
    for (std::string_view p : kTextPrefixes)
      if (hf_name.substr(0, p.size()) == p) {
        text_name = "model." + std::string(hf_name.substr(p.size()));
        hf_name = text_name;
        break;
      }
    if (hf_name == "language_model.lm_head.weight") hf_name = "lm_head.weight";
  }
  for (const NameRow& r : kGlobal)
    if (r.hf == hf_name)
      return r.gguf.empty() ? std::optional<std::string>() : std::optional<std::string>(std::string(r.gguf));

  if (hf_name.substr(0, kLayerPrefix.size()) == kLayerPrefix) {
    std::string_view rest = hf_name.substr(kLayerPrefix.size());
    if (const std::optional<uint64_t> layer = leading_index(rest)) {
      if (const NameRow* r = find_row(arch, rest)) {
        if (r->gguf.empty()) return std::optional<std::string>();
        return std::optional<std::string>("blk." + std::to_string(*layer) + "." + std::string(r->gguf));
      }
    }
  }
  return make_error("tensor '", safetensors::printable(hf_name, 200), "' has no known GGUF name for architecture '",
                    arch, "'");
}

}  // namespace kite::hf
