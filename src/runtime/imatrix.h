// kite/src/runtime/imatrix.h — importance matrices (`kite imatrix`): for every 2-D weight a
// matmul uses, the sum over calibration tokens of each input column's squared activation, and
// the number of tokens. `kite quantize --imatrix` turns them into per-column importance
// (sum / count = E[a_j^2]) that weights the quantizers' error (formats/quant/types.h).
//
// Collection runs the model through Context's op observer: after each mul_mat node, its src[1]
// (the activations, F32 [n_cols, n_tokens]) is downloaded and accumulated under src[0]'s name
// (the GGUF tensor name); after each mul_mat_id node, under the expert its route chose for each
// column. Files use llama.cpp's imatrix GGUF layout, so llama-quantize reads
// kite's files and kite reads llama-imatrix's:
//   general.type = "imatrix", imatrix.datasets (string array), imatrix.chunk_count and
//   imatrix.chunk_size (u32); per weight, F32 tensors "<name>.in_sum2" [n_cols, 1] and
//   "<name>.counts" [1, 1], in name order.
// Mixture-of-experts weights (3-D, [n_cols, n_rows, n_expert]) as llama-imatrix keeps them: one
// sum per column and expert ("<name>.in_sum2" [n_cols, n_expert]) and one count per expert
// ("<name>.counts" [1, n_expert]), accumulated from the tokens routed to each expert (the
// mul_mat_id nodes' route).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/base/status.h"
#include "src/core/backend.h"
#include "src/model/model.h"
#include "src/runtime/tokenizer.h"

namespace kite {

struct ImatrixEntry {
  std::vector<double> sum2;     // per input column (the weight's ne[0]) and matrix: sum of a_j^2
  std::vector<int64_t> counts;  // per matrix (one; an MoE weight: one per expert): rows accumulated
  int64_t n_cols() const { return counts.empty() ? 0 : static_cast<int64_t>(sum2.size() / counts.size()); }
};

struct Imatrix {
  std::map<std::string, ImatrixEntry> entries;  // by weight name ("blk.0.attn_q.weight")
  std::vector<std::string> datasets;            // calibration files
  uint32_t chunk_count = 0;
  uint32_t chunk_size = 0;                      // tokens per chunk

  // Per-column importance sum2 / count (per matrix: n_cols values an expert) for each entry with
  // a non-zero count: what the quantizers weight their error with (llama-quantize normalizes the
  // same way, and gives an expert no token reached the importance 1 everywhere).
  std::map<std::string, std::vector<float>> importance() const;
};

Status save_imatrix(const Imatrix& m, const std::string& path);
// Errors name the file and the entry: not a GGUF file, an in_sum2 without its counts (or the
// reverse), non-F32 data, sums and counts of different matrix counts, non-finite or negative
// values.
Result<Imatrix> load_imatrix(const std::string& path);

// Accumulates the activations of every matmul whose weight name passes the filter: blk.* (as
// llama-imatrix), plus the output projection (output.weight, or token_embd.weight when tied)
// with include_output (llama-imatrix's --process-output).
class ImatrixCollector {
 public:
  explicit ImatrixCollector(bool include_output = false) : include_output_(include_output) {}
  // For ContextOptions::op_observer (the collector must outlive the context's use of it).
  std::function<Status(const Tensor&, const Backend&)> observer();
  Status observe(const Tensor& node, const Backend& backend);
  Status observe_experts(const Tensor& node, const Backend& backend);
  Imatrix& imatrix() { return m_; }

 private:
  bool include_output_;
  Imatrix m_;
  std::vector<uint8_t> bytes_;
};

struct ImatrixOptions {
  int64_t n_ctx = 512;       // tokens per chunk
  int64_t max_chunks = 0;    // 0: every whole chunk of the text; fewer are spread evenly over it
  int n_threads = 0;
  bool include_output = false;
  std::string dataset;       // recorded in imatrix.datasets
};

struct ImatrixRun {
  Imatrix imatrix;
  double ppl = 0;  // of the chunks' second halves (llama.cpp's perplexity), a sanity check
};

// Runs `model` over `tokens` (the calibration text tokenized with BOS) in chunks of n_ctx, BOS
// first (as llama-imatrix and llama-perplexity cut them), collecting an importance matrix. With
// max_chunks below the text's chunk count, the chunks are spread evenly over the text (llama-
// imatrix takes the first ones), so a calibration over several files sees all of them.
// `progress(done, total)` after each chunk.
Result<ImatrixRun> compute_imatrix(std::shared_ptr<const Model> model, std::span<const TokenId> tokens, TokenId bos,
                                   const ImatrixOptions& opt,
                                   const std::function<void(int64_t, int64_t)>& progress = {});

// --- Sensitivity (`kite quantize --sensitivity`) ----------------------------------------------
//
// Quantizes one tensor group at a time to a type, leaving every other tensor as the source has
// it, and measures the perplexity (llama.cpp's definition) each costs: data for choosing mixes.
// Groups: attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down (all layers), and
// token_embd, output; with per_layer, "blk.N.attn_q" etc. one layer at a time. Everything stays
// in memory: the quantized group overlays the source's tensors.

struct SensitivityOptions {
  quant::Type type = quant::Type::Q4_K;
  int64_t n_ctx = 256;
  int64_t max_chunks = 0;  // 0: every whole chunk
  int n_threads = 0;
  bool per_layer = false;
  const std::map<std::string, std::vector<float>>* importance = nullptr;  // optional imatrix
};

struct SensitivityRow {
  std::string group;
  size_t n_tensors = 0;
  double ppl = 0;
  uint64_t bytes_before = 0, bytes_after = 0;  // the group's tensor data
};

struct SensitivityReport {
  double base_ppl = 0;             // the source as it is
  std::vector<SensitivityRow> rows;  // sorted by ppl, highest (costliest) first
  int64_t chunks = 0;
  std::vector<std::string> skipped;  // tensors whose rows are not whole blocks of the type
};

// `source` is shared by the overlays; `tokens` is the text tokenized with BOS.
// `progress(done, total)` after each measured model (the base one included).
Result<SensitivityReport> quantization_sensitivity(std::shared_ptr<const WeightSource> source,
                                                   std::span<const TokenId> tokens, TokenId bos,
                                                   const SensitivityOptions& opt,
                                                   const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace kite
