// kite/src/model/hparams.h — a model's hyperparameters, read from GGUF-convention metadata
// (a GGUF file as written, or an HF folder translated by formats/).
#pragma once

#include <cstdint>
#include <string>

#include "formats/weight_source.h"
#include "src/core/graph.h"

namespace kite {

struct HParams {
  std::string arch;          // "llama", "qwen2", "qwen3", "qwen3moe"
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

  static Result<HParams> from(const WeightSource& src);
};

}  // namespace kite
