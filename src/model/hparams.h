// kite/src/model/hparams.h — a model's hyperparameters, read from GGUF-convention metadata
// (a GGUF file as written, or an HF folder translated by formats/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/weight_source.h"
#include "src/core/graph.h"

namespace kite {

struct HParams {
  std::string arch;          // "llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3"
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t n_ff = 0;
  // Mixture of experts (llama with expert_count, e.g. Mixtral; qwen3moe): n_expert > 0. Each
  // token's FFN is the n_expert_used most probable of n_expert experts of width n_ff_exp.
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  float expert_weights_scale = 0.f;  // the chosen experts' weights times this (0: not scaled)
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-5f;
  RopeParams rope;
  float attn_scale = 0.f;  // scores times this (0: 1 / sqrt(head_dim))

  // gemma2 and gemma3: the embedding times sqrt(n_embd); RMS norms after attention and after the
  // FFN too (before each residual add); gelu's tanh form gates the FFN instead of silu;
  // sliding-window attention on the layers `swa_layer` marks, which rope with `rope_swa`; and
  // soft-capped attention scores and logits (gemma2; gemma3's logits where the file asks).
  bool gemma = false;
  float attn_softcap = 0.f;   // 0: none
  float final_softcap = 0.f;  // 0: none
  int32_t n_swa = 0;               // the window, in positions (0: every layer attends to all)
  std::vector<uint8_t> swa_layer;  // [n_layer]; 1: a sliding-window layer
  RopeParams rope_swa;

  bool is_swa(int64_t il) const { return n_swa > 0 && swa_layer[static_cast<size_t>(il)] != 0; }

  static Result<HParams> from(const WeightSource& src);
};

}  // namespace kite
