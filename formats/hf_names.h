// kite/formats/hf_names.h — Hugging Face tensor names -> GGUF tensor names.
//
// One pure table per architecture (the tinygrad way): a checkpoint name either maps to the
// GGUF name llama.cpp's converter gives it, is known to carry nothing the model needs
// (rotary_emb.inv_freq: recomputed from the config), or is an error naming the tensor.
//   model.embed_tokens.weight                 -> token_embd.weight
//   model.layers.3.self_attn.q_proj.weight    -> blk.3.attn_q.weight
//   lm_head.weight                            -> output.weight
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "src/base/status.h"

namespace kite::hf {

// `arch` is the GGUF architecture ("llama", "qwen2", "qwen3"). Returns the GGUF name, or
// nullopt for a tensor to skip, or an error for a name the architecture does not know.
Result<std::optional<std::string>> gguf_tensor_name(std::string_view arch, std::string_view hf_name);

}  // namespace kite::hf
