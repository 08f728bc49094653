// kite/src/model/model.h — a loaded model: hyperparameters and weights, shared read-only by
// every context, plus the forward graph of its architecture.
//
// Weights stay where the WeightSource mapped them (the CPU computes straight from the mmap);
// only the small 1-D tensors (norms, biases) are converted to F32 at load, since kernels read
// them as float rows.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "formats/weight_source.h"
#include "src/core/graph.h"
#include "src/model/hparams.h"

namespace kite {

struct LayerWeights {
  Tensor* attn_norm = nullptr;  // (n_embd)
  Tensor* wq = nullptr;         // (n_embd, n_head * head_dim)
  Tensor* wk = nullptr;         // (n_embd, n_head_kv * head_dim)
  Tensor* wv = nullptr;         // (n_embd, n_head_kv * head_dim)
  Tensor* wo = nullptr;         // (n_head * head_dim, n_embd)
  Tensor* bq = nullptr;         // qwen2: (n_head * head_dim)
  Tensor* bk = nullptr;
  Tensor* bv = nullptr;
  Tensor* q_norm = nullptr;     // qwen3: (head_dim)
  Tensor* k_norm = nullptr;
  Tensor* attn_post_norm = nullptr;  // gemma3: (n_embd), the attention output's norm
  Tensor* ffn_norm = nullptr;   // (n_embd)
  Tensor* ffn_post_norm = nullptr;  // gemma3: (n_embd), the FFN output's norm
  Tensor* w_gate = nullptr;     // (n_embd, n_ff)
  Tensor* w_up = nullptr;       // (n_embd, n_ff)
  Tensor* w_down = nullptr;     // (n_ff, n_embd)
  // Mixture of experts (instead of w_gate/w_up/w_down): the router and the stacked experts.
  Tensor* ffn_gate_inp = nullptr;   // (n_embd, n_expert)
  Tensor* ffn_gate_exps = nullptr;  // (n_embd, n_ff_exp, n_expert)
  Tensor* ffn_up_exps = nullptr;    // (n_embd, n_ff_exp, n_expert)
  Tensor* ffn_down_exps = nullptr;  // (n_ff_exp, n_embd, n_expert)
};

// The per-step inputs of the forward graph (I32 leaves the context fills before each run).
struct ForwardInputs {
  Tensor* tokens = nullptr;       // [n_tokens]
  Tensor* positions = nullptr;    // [n_tokens]
  Tensor* token_seq = nullptr;    // [n_tokens] sequence index into the block table
  Tensor* kv_slots = nullptr;     // [n_tokens] physical KV slot of each token
  Tensor* block_table = nullptr;  // [max_blocks, n_seqs]
  Tensor* out_rows = nullptr;     // [n_outputs] token indices whose logits are wanted
};

// Tensor parallelism (Megatron-style, docs/ARCHITECTURE.md): rank `rank` of `world` holds a
// 1/world slice of every layer's heads and FFN width. Q/K/V and FFN gate/up are split by output
// rows (views into the same weight bytes), attention output and FFN down by input columns (a
// copy of each row's slice); each of the last two ends in an all_reduce. The embedding, norms and
// LM head are whole on every rank.
struct TpRank {
  int32_t rank = 0;
  int32_t world = 1;
};

// What a forward graph ends in: the LM head's logits [n_vocab, n_outputs], or the final hidden
// state after the final norm [n_embd, n_outputs] (embeddings; the LM head is skipped).
enum class OutputKind { kLogits, kHidden };

// Loading options. `progress(done, total)` is called as the weights are prepared (once per
// tensor looked up, and last with done == total); returning false cancels the load, which then
// fails with "loading cancelled".
struct LoadOptions {
  std::function<bool(size_t done, size_t total)> progress;
};

// The KV storage a forward pass writes and reads: per layer a K and a V cache tensor
// [head_dim * n_head_kv, n_slots].
struct KvTensors {
  std::vector<Tensor*> k;
  std::vector<Tensor*> v;
  int32_t block_size = 16;
};

class Model {
 public:
  static Result<std::shared_ptr<Model>> load(const std::string& path);
  static Result<std::shared_ptr<Model>> load(const std::string& path, const LoadOptions& opts);
  static Result<std::shared_ptr<Model>> from_source(std::unique_ptr<WeightSource> source, const LoadOptions& opts = {});

  const HParams& hparams() const { return hp_; }
  const WeightSource& source() const { return *source_; }

  // Builds the forward graph of one batch into `g`; returns the logits [n_vocab, n_outputs], or
  // with OutputKind::kHidden the normed final hidden state [n_embd, n_outputs].
  // Nodes are tagged with their model part (Graph::set_layer): -1 the token embedding lookup,
  // il for transformer layer il, n_layer the output norm and LM head.
  // With tp.world > 1, the graph of rank tp.rank (check_tensor_parallel first; kv holds that
  // rank's KV heads, rank_hparams(world)).
  Tensor* build_forward(Graph& g, const ForwardInputs& in, const KvTensors& kv,
                        OutputKind kind = OutputKind::kLogits, TpRank tp = {}) const;

  // Whether `t` is a mixture-of-experts layer's stacked experts (ffn_{gate,up,down}_exps).
  static bool is_expert_weight(const Tensor& t) { return is_expert_weight(t.name); }
  static bool is_expert_weight(std::string_view name) { return name.find("_exps.") != std::string_view::npos; }

  // Whether the model splits over `world` ranks: heads, KV heads and FFN width divisible by it,
  // and the attention-output and FFN-down slices whole blocks of their weight types.
  Status check_tensor_parallel(int32_t world) const;
  // One rank's hyperparameters: n_head, n_head_kv and n_ff divided by `world`.
  HParams rank_hparams(int32_t world) const;

  // Bytes of the weights read by the model parts for which `part(layer)` is true (layer as in
  // build_forward's tags); a tensor shared by two parts (tied embeddings) counts once. With
  // tp.world > 1, rank tp.rank's share (its layer slices, the whole embedding and head).
  size_t weight_bytes(const std::function<bool(int32_t layer)>& part,
                      const std::function<bool(const Tensor&)>& skip = {}, TpRank tp = {}) const;

 private:
  Model() = default;
  Result<Tensor*> weight(const std::string& name, bool required = true);
  Status load_weights(const LoadOptions& opts);

  // One rank's layer weights (tensor_parallel.cpp); made on first use, kept while the model
  // lives (GPU weight copies are keyed by the host bytes, so contexts share them).
  struct Shard {
    std::vector<LayerWeights> layers;
    std::vector<std::unique_ptr<Tensor>> tensors;
    std::vector<std::vector<uint8_t>> bytes;  // row-parallel slices
  };
  const std::vector<LayerWeights>& layers_for(TpRank tp) const;

  std::unique_ptr<WeightSource> source_;
  HParams hp_;
  std::vector<std::unique_ptr<Tensor>> tensors_;     // weight tensor descriptions
  std::vector<std::vector<float>> f32_copies_;       // 1-D weights converted to F32
  Tensor* tok_embd_ = nullptr;                       // (n_embd, n_vocab)
  Tensor* output_norm_ = nullptr;                    // (n_embd)
  Tensor* output_ = nullptr;                         // (n_embd, n_vocab); token_embd when tied
  Tensor* rope_freqs_ = nullptr;                     // (head_dim / 2) llama3 frequency divisors, optional
  std::vector<LayerWeights> layers_;
  mutable std::mutex shards_mu_;
  mutable std::map<std::pair<int32_t, int32_t>, std::unique_ptr<Shard>> shards_;  // (rank, world)
  // Load progress (only during load_weights()).
  const LoadOptions* load_opts_ = nullptr;
  size_t load_done_ = 0, load_total_ = 0;
};

}  // namespace kite
