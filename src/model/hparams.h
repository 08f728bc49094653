// kite/src/model/hparams.h — a model's hyperparameters, read from GGUF-convention metadata
// (a GGUF file as written, or an HF folder translated by formats/).
#pragma once

#include <cstdint>
#include <string>

#include "formats/weight_source.h"
#include "src/core/graph.h"

namespace kite {

struct HParams {
  std::string arch;          // "llama", "qwen2", "qwen3"
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t n_ff = 0;
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-5f;
  RopeParams rope;

  static Result<HParams> from(const WeightSource& src);
};

}  // namespace kite
