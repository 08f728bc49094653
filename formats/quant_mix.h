// kite/formats/quant_mix.h — which type each tensor gets when a model is quantized.
//
// A "mix" is what llama.cpp calls a file type (LLAMA_FTYPE_MOSTLY_Q4_K_M, ...): a default type
// plus rules that give some tensors other types. The rules follow llama.cpp's documented
// behaviour (llama_tensor_get_type) so that kite's Q4_K_M file of a model has the same tensor
// types as llama-quantize's:
//   - only tensors named *.weight with 2+ dims are quantized; norms, biases and other 1-D
//     tensors keep their type (F32 when converting from 16-bit Hugging Face weights);
//   - the output projection (or token_embd when the embeddings are tied) gets Q6_K
//     (Q8_0 when its rows are not whole 256-blocks; unchanged for Q8_0);
//   - attn_v / ffn_down / attn_output get more bits in the K mixes (per layer for the _M mixes);
//   - the IQ1/IQ2 mixes give the token embedding Q2_K or IQ3_S, the output Q5_K, attn_v Q2_K /
//     IQ3_S (Q4_K with grouped-query attention) and the first eighth of ffn_down more bits; the
//     IQ3 mixes move attn_q/attn_k (IQ3_XS: and the middle layers' FFN) down a type;
//   - a K/IQ type on rows that are not a multiple of 256 falls back to Q5_0 (from Q4_K), Q5_1
//     (Q5_K), Q8_0 (Q6_K), Q4_0 (Q2_K, Q3_K) or IQ4_NL (IQ4_XS and the IQ1..IQ3 types), F16 if
//     even that does not fit.
// A plain type name ("q4_K", "q8_0", "f16", ...) that is not a mix name quantizes every
// quantizable tensor to that type (llama.cpp's --pure), with the same row-length fallbacks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/gguf.h"
#include "src/base/status.h"

namespace kite::quant {

struct Mix {
  std::string_view name;      // "Q4_K_M", "F16", "q4_K" (plain type: ggml's name)
  uint32_t file_type;         // general.file_type (llama_ftype)
  Type default_type;
  bool pure;                  // a plain type: no per-tensor rules
};

// A mix or plain type by name, case-insensitive ("q4_k_m", "Q8_0", "bf16", "q5_k");
// nullptr if unknown.
const Mix* find_mix(std::string_view name);
// Every accepted name, mixes first, for help texts and error messages.
std::vector<std::string> known_mix_names();

struct PlanOptions {
  // Tensors left unquantized become F32 when they are 16-bit floats (convert_hf_to_gguf's
  // convention for 1-D tensors); when false they keep their type (llama-quantize's).
  bool small_tensors_f32 = false;
  // Every quantizable tensor in the mix's default type (llama-quantize --pure).
  bool pure = false;
  // An importance matrix will weight the quantizers: some rules (IQ3_XXS, IQ4_NL/IQ4_XS, Q4_0,
  // Q5_0) choose differently with one, as llama.cpp's do.
  bool has_imatrix = false;
  // llama-quantize's overrides, applied before the mix's rules and in their place (the row-length
  // fallbacks still apply): --token-embedding-type, --output-tensor-type and --tensor-type
  // PATTERN=TYPE, the first pattern found in a quantizable tensor's name (ECMAScript regex
  // search) giving its type. As in llama.cpp, a token embedding tied to the output takes
  // output_tensor_type where the mix's rules would decide it (not under pure or a pattern).
  std::optional<Type> token_embedding_type = {};
  std::optional<Type> output_tensor_type = {};
  std::vector<std::pair<std::string, Type>> tensor_types = {};
};

// Whether a tensor of `mix` quantized to `type` needs an importance matrix (llama.cpp's rule): the
// 1-3 bit codebook types but IQ3_S, and Q2_K in a Q2_K_S mix, everywhere but the token embedding
// and the output projection. Without one they lose so much that the file is not worth writing.
bool needs_importance(const Mix& mix, std::string_view tensor, Type type);

// "PATTERN=TYPE" (--tensor-type) as a pattern and a type kite can produce; errors name the problem.
Result<std::pair<std::string, Type>> parse_tensor_type(std::string_view arg);

struct PlanEntry {
  Type type;
  bool fallback = false;  // the rule's type did not fit the row length
};

// The type of each tensor of `tensors` (in order) under `mix`. `meta` supplies the
// architecture and head counts (attn_v's rule for Q2_K depends on n_head / n_head_kv).
Result<std::vector<PlanEntry>> plan_types(const Mix& mix, const std::vector<gguf::TensorInfo>& tensors,
                                          const gguf::Metadata& meta, const PlanOptions& opt = {});

}  // namespace kite::quant
