// kite/formats/weight_source.h — where a model's weights and hyperparameters come from.
//
// The model code never knows which format a model came from. Every source presents:
//   - metadata under GGUF's key convention (general.architecture, llama.block_count,
//     tokenizer.ggml.tokens, ...): a GGUF file as written, an HF folder translated from
//     config.json / tokenizer.json / tokenizer_config.json;
//   - tensors under GGUF's names (token_embd.weight, blk.0.attn_q.weight, ...) with ggml-order
//     shapes (ne[0] innermost) and pointers into a read-only mapping that the source keeps alive.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf.h"
#include "src/base/status.h"

namespace kite {

using TensorInfo = gguf::TensorInfo;

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // Opens a GGUF file, or a Hugging Face folder (config.json + *.safetensors).
  static Result<std::unique_ptr<WeightSource>> open(const std::string& path);

  virtual std::string_view format() const = 0;  // "gguf" or "safetensors"
  virtual const std::string& path() const = 0;
  virtual const gguf::Metadata& metadata() const = 0;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  virtual const TensorInfo* find_tensor(std::string_view name) const = 0;

  // True when the attention Q/K rows of a llama-family model are in Hugging Face order (the
  // rotary halves split, "neox" layout). GGUF files from llama.cpp permute them for its
  // interleaved rope; both give the same model with the matching rope layout.
  virtual bool qk_hf_order() const = 0;

  Result<std::string> arch() const { return metadata().get<std::string>("general.architecture"); }
};

}  // namespace kite
