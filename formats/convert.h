// kite/formats/convert.h — write a model (GGUF file or Hugging Face folder) as a GGUF file with
// each tensor in the type a mix assigns it (see quant_mix.h): `kite convert` and `kite quantize`.
//
// Metadata is copied as the source presents it (an HF folder already uses GGUF's keys, tokenizer
// and chat template included); general.file_type is set to the mix's llama_ftype and
// general.quantization_version to 2 when any tensor is quantized. For a llama model whose source
// keeps Hugging Face's Q/K row order (WeightSource::qk_hf_order()), the rows of attn_q / attn_k
// (weights and biases) are permuted to llama.cpp's interleaved rope order, as convert_hf_to_gguf
// does, so the file loads in llama.cpp and in kite with the same outputs.
//
// Tensors are processed one at a time, rows split over threads. The output is written through
// gguf::Writer: a temp file beside `out_path`, renamed only when complete, so a failure leaves
// no file behind (and an existing file at out_path untouched).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/quant_mix.h"
#include "formats/weight_source.h"
#include "src/base/status.h"

namespace kite {

struct ConvertOptions {
  std::string type = "F16";        // a mix or plain type name (quant::find_mix)
  int threads = 0;                 // 0: all hardware threads
  bool allow_requantize = false;   // accept sources holding quantized tensors
  // 16-bit 1-D tensors (norms, biases) become F32 (convert_hf_to_gguf's convention); quantize
  // leaves unquantized tensors as they are.
  bool small_tensors_f32 = false;
  // Every quantizable tensor in the mix's default type, without its per-tensor rules (llama-quantize
  // --pure); a plain type name is pure already.
  bool pure = false;
  // llama-quantize's per-tensor overrides (quant::PlanOptions has the rules).
  std::optional<quant::Type> token_embedding_type;
  std::optional<quant::Type> output_tensor_type;
  std::vector<std::pair<std::string, quant::Type>> tensor_types;  // PATTERN, TYPE (first match wins)
  // Write tensors in llama-quantize's order (tensors outside blocks first, then block by block,
  // by name within each); when false, the source's order (convert_hf_to_gguf keeps it). The
  // per-layer rules of the mixes count layers in this order, as llama.cpp does.
  bool llama_quantize_order = false;
  // Per-column importance by tensor name (an importance matrix, see src/runtime/imatrix.h:
  // mean squared activation of each input column). Tensors found here are quantized minimizing
  // the importance-weighted error (quant::quantize_rows_importance) when their type uses weights;
  // a length different from the tensor's row length is an error. The 1-3 bit codebook types (all
  // but IQ3_S) and a Q2_K_S mix's Q2_K need it: a tensor of those types (but the token embedding
  // and output) without an entry is an error, as in llama.cpp. Not owned; may be null.
  const std::map<std::string, std::vector<float>>* importance = nullptr;
  // Called after each tensor with bytes of source data processed so far and in total.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // One line per tensor ("blk.0.attn_v.weight: f16 -> q6_K") and warnings; may be empty.
  std::function<void(const std::string&)> log;
};

struct ConvertStats {
  size_t n_tensors = 0;
  size_t n_permuted = 0;   // attn_q / attn_k tensors whose rows were reordered
  size_t n_fallback = 0;   // tensors whose rule type did not fit their rows
  size_t n_weighted = 0;   // tensors quantized with importance weights
  size_t n_unweighted = 0; // importance given, but the tensor's type ignores it or it has no entry
  uint64_t bytes_in = 0;   // tensor data read
  uint64_t bytes_out = 0;  // tensor data written (without padding)
  uint32_t file_type = 0;
};

// Writes `src` to `out_path` with the types of `opt.type`. Errors: unknown type (the message lists
// the known ones), a quantized source without allow_requantize, a tensor type kite cannot read or
// produce, a value the target type cannot hold, an unwritable output.
Result<ConvertStats> convert_model(const WeightSource& src, const std::string& out_path, const ConvertOptions& opt);

// llama.cpp's Q/K permutation for one row index: the row that lands at `row` of a tensor with
// `n_rows` rows in `n_head` heads (HF's split halves -> interleaved pairs).
int64_t qk_permuted_source_row(int64_t row, int64_t n_rows, int64_t n_head);

// llama.cpp's loader order of tensor names: block index (-1 outside blocks), then name.
bool llama_tensor_order_less(const std::string& a, const std::string& b);

}  // namespace kite
