// kite/formats/hf_names.h — Hugging Face tensor names -> GGUF tensor names.
//
// One pure table per architecture (the tinygrad way): a checkpoint name either maps to the
// GGUF name llama.cpp's converter gives it, is known to carry nothing the model needs
// (rotary_emb.inv_freq: recomputed from the config), or is an error naming the tensor.
//   model.embed_tokens.weight                 -> token_embd.weight
//   model.layers.3.self_attn.q_proj.weight    -> blk.3.attn_q.weight
//   lm_head.weight                            -> output.weight
// A mixture of experts' checkpoint holds each expert's matrices apart; GGUF stacks them:
//   model.layers.3.mlp.experts.5.up_proj.weight          -> blk.3.ffn_up_exps.weight, expert 5
//   model.layers.3.block_sparse_moe.experts.5.w3.weight  -> (the same, Mixtral's names)
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "src/base/status.h"

namespace kite::hf {

// `arch` is the GGUF architecture ("llama", "qwen2", "qwen3", "qwen3moe"). Returns the GGUF
// name, or nullopt for a tensor to skip, or an error for a name the architecture does not know.
// (Experts' matrices: expert_piece.)
Result<std::optional<std::string>> gguf_tensor_name(std::string_view arch, std::string_view hf_name);

// One expert's matrix: the stacked GGUF tensor it is a slice of, and its index there.
struct ExpertPiece {
  std::string gguf_name;  // "blk.3.ffn_up_exps.weight"
  int64_t expert = 0;
};
// The piece `hf_name` is (qwen3moe's and Mixtral's expert names), else nullopt.
std::optional<ExpertPiece> expert_piece(std::string_view arch, std::string_view hf_name);

}  // namespace kite::hf
