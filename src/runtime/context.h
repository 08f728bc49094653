// kite/src/runtime/context.h — per-session state over a shared Model: the KV cache, the graphs
// (one per batch shape, built once and reused), the activation arenas and the backends.
//
// Placement (ContextOptions::gpu_layers, llama.cpp's -ngl): the graph runs on one backend, or
// split by layer between the CPU (backend 0: token embedding, the first layers) and `device`
// (backend 1: the last N layers and the output head). Each layer's KV lives on its backend;
// activations cross at split boundaries only (src/core/split.h).
//
// Thread-safety: a Context is used by one thread at a time; many Contexts may share a Model.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "src/base/thread_team.h"
#include "src/core/backend.h"
#include "src/core/comm.h"
#include "src/core/planner.h"
#include "src/core/split.h"
#include "src/kv/kv_cache.h"
#include "src/model/model.h"
#include "src/runtime/top_logits.h"

namespace kite {

inline constexpr int32_t kGpuLayersAuto = -2;  // ContextOptions::gpu_layers: as many as fit

struct ContextOptions {
  int n_threads = 0;       // 0: all physical cores
  int64_t n_ctx = 2048;    // positions per sequence
  int32_t n_seqs = 1;      // sequence slots of the KV cache
  DType kv_type = DType::F16;
  int64_t kv_blocks = 0;   // KV pool size in blocks; 0: n_seqs x n_ctx positions
  int32_t kv_block_size = 16;
  bool prefix_cache = true;
  std::string device = "cpu";
  // How many transformer layers run on `device` (llama.cpp's -ngl): -1 (default) runs the whole
  // graph there; N >= 0 runs the *last* N layers and the output norm + LM head on `device` and
  // the token embedding lookup and the first n_layer - N layers on the CPU (N >= n_layer: every
  // layer on the device, the lookup on the CPU; 0: all on the CPU). With device "cpu" and N > 0
  // the device is a second CPU backend instance (tests; measuring what a split costs).
  // kGpuLayersAuto (-2): as many of the last layers as fit in the device's free memory, with
  // room left for activations (all of them, and the embedding, when the whole model fits).
  int32_t gpu_layers = -1;
  // A mixture-of-experts model's experts on the CPU, the rest of each layer on `device` (llama.cpp's
  // --cpu-moe: a model bigger than the GPU's memory, most of it experts). Without it they run on
  // the CPU only where `device` has no kernels for their type.
  bool cpu_moe = false;
  // Tensor parallelism: ranks of a group on `device`, each running every layer over its slice
  // of the heads and FFN width (model.h, TpRank), summing partial results with all_reduce.
  // "cpu": ranks are threads of this process, n_threads shared among them (the sharding runs
  // anywhere; no faster than one rank). Not with gpu_layers / placement.
  int32_t tensor_parallel = 1;
  // Test hook, overrides gpu_layers: the backend (0: the CPU, 1: `device`) of each model part
  // (-1: the token embedding, 0..n_layer-1: the layers, n_layer: the output head).
  std::function<int(int32_t layer)> placement;
  // Debug: print every op whose name or op contains this filter ("*" for all) with its shape
  // and statistics to stderr, op by op; with dump_dir, also write each as raw F32 (.f32).
  std::string dump_ops;
  std::string dump_dir;
  // Called after each graph node is computed (the graph then runs op by op, which is slower):
  // `backend` can download the node or its sources. Used by `kite imatrix` to collect the
  // activations every weight multiplies. An error stops the step.
  std::function<Status(const Tensor& node, const Backend& backend)> op_observer;
};

// One token of a batch: appended at the end of sequence `seq`.
struct BatchToken {
  int32_t token = 0;
  int32_t seq = 0;
  bool logits = false;  // keep this token's output (its logits, or its hidden state with kHidden)
};

// What a decode step brings back of each output's logits: the whole row (k 0), or its k best
// entries reduced on the device (Op::kTopK; with log_sum_exp also the row's normalizer, which
// logprobs need). At 64 sequences of a 128K vocabulary that is 33 KB a step instead of 33 MB.
struct OutputTopK {
  int32_t k = 0;  // 0: logits(i); 1..kMaxTopK: top_logits(i)
  bool log_sum_exp = false;
  // Also a token drawn from each output's whole row on the device (one per output, in order;
  // TopLogits::drawn), or none when empty. Needs supports_top_k(true).
  std::span<const RowDraw> draws;
  // Outputs (ascending indices) whose whole rows come back as well, for logits(i): the rows a
  // grammar, a penalty or a sampled proposal's verification reads, in a step whose other rows
  // need only their top k. Every other row stays on the device.
  std::span<const int32_t> whole_rows;
};

class Context {
 public:
  static Result<std::unique_ptr<Context>> create(std::shared_ptr<const Model> model, const ContextOptions& opts);
  ~Context();

  // Runs one model step over `batch`; afterwards logits(i) holds the logits of the i-th token
  // that asked for them, or with OutputKind::kHidden hidden(i) its final hidden state after the
  // final norm (the LM head is skipped). When no token asks, the last one's output is kept.
  // With top_k.k > 0 (kLogits only) the step keeps each output's top_k.k best logits instead.
  // On error nothing is appended to any sequence.
  Status decode(std::span<const BatchToken> batch, OutputKind kind = OutputKind::kLogits, OutputTopK top_k = {});
  // Valid after a kLogits step without top_k (or eval()), or for top_k.whole_rows: n_vocab floats.
  std::span<const float> logits(size_t i) const;
  // Whether logits(i) is valid: after a kLogits step, without top_k or for its whole_rows.
  bool has_logits(size_t i) const;
  // Output i's whole row after a top-k step, downloaded from where the step left it (valid until
  // the next decode or fetch of rows not yet fetched): for the row a sampler finds it needs only
  // once it has seen the top k (its candidates reaching past them). logits(i) where has_logits(i).
  Result<std::span<const float>> fetch_logits(size_t i);
  // Downloads several outputs' rows at once (one wait on a device), for fetch_logits(i).
  Status fetch_logits(std::span<const size_t> outputs);
  // Valid after a step with top_k.k > 0.
  TopLogits top_logits(size_t i) const;
  // Whether steps can reduce their logits to the top k (and draw from them: `draw`) on the
  // backend that computes them.
  bool supports_top_k(bool draw = false) const;
  // Valid after a kHidden step: n_embd floats.
  std::span<const float> hidden(size_t i) const;
  size_t n_outputs() const { return n_outputs_; }

  // Convenience: appends `tokens` to `seq` in chunks of at most `n_batch`; keeps the logits of
  // the last token, or of every token when `all_logits` (then logits(i) is token i's).
  Status eval(std::span<const int32_t> tokens, int32_t seq = 0, bool all_logits = false, size_t n_batch = 512);

  KvCache& kv() { return *kv_; }
  const Model& model() const { return *model_; }

  // The backends the graph runs on: one, or with a split [0] the CPU and [1] the device.
  size_t n_backends() const { return backends_.size(); }
  Backend& backend(size_t i) const { return *backends_[i]; }
  // The backend index of model part `layer` (-1: token embedding, n_layer: output head).
  int placement(int32_t layer) const { return placement_(layer); }
  // With gpu_layers kGpuLayersAuto: the count it chose (-1: the whole model on the device).
  std::optional<int32_t> auto_gpu_layers() const { return auto_layers_; }
  // Whether an MoE model's experts run on the CPU beside the device (cpu_moe, or the device has
  // no kernels for them).
  bool experts_on_cpu() const { return fallback_ >= 0; }
  const ContextOptions& options() const { return opts_; }
  // Copies between backends so far, and the splits / copies of the last step's graph.
  const SplitStats& split_stats() const { return split_stats_; }
  int last_splits() const { return last_splits_; }
  int last_copies() const { return last_copies_; }
  // Whether the last decode built its graph (the first step of its shape, so a slower one).
  bool last_built_graph() const { return last_built_graph_; }

 private:
  struct Step;
  Context();
  Status open_backends();
  Status check_device_memory() const;
  std::pair<int64_t, int64_t> kv_blocks() const;
  size_t device_bytes(const Backend& dev, int64_t k, bool embedding = false) const;
  int32_t layers_that_fit(const Backend& dev) const;
  bool experts_supported(const Backend& dev) const;
  bool on_cpu(const Backend& dev, const Tensor& t) const;
  Result<Step*> step_for(int64_t n_tokens, int64_t n_outputs, OutputKind kind, OutputTopK top_k);
  Status dump_op(const Tensor& n, Backend& backend, int step_no);
  // A step input's host bytes; upload_inputs() sends a step's inputs to backend `b` in as few
  // copies as their places in its arena allow.
  struct UploadPiece {
    const Tensor* input;  // null: the step has no such input
    const void* data;
    size_t bytes;
  };
  struct Placed {
    uint8_t* p;
    const UploadPiece* in;
  };
  Status upload_inputs(Step& step, size_t b, std::span<const UploadPiece> inputs);
  // Runs the step's graphs: one, or with tensor parallelism every rank's at once.
  // Runs a step and waits for its backends, except `downloads_next`, whose download right after
  // is the wait (one host round trip a decode step, not two).
  Status compute(Step& step, const Backend* downloads_next = nullptr);

  std::shared_ptr<const Model> model_;
  ContextOptions opts_;
  std::unique_ptr<Communicator> comm_;          // tensor parallelism: the ranks' group
  std::unique_ptr<ThreadTeam> rank_threads_;  // runs ranks 1.. beside the caller's rank 0
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<Backend*> backend_ptrs_;
  std::function<int(int32_t layer)> placement_;
  int fallback_ = -1;  // where nodes their backend lacks run (0: the CPU, for MoE experts), or -1
  std::optional<int32_t> auto_layers_;  // (auto_gpu_layers)
  std::unique_ptr<KvCache> kv_;
  // (tokens, outputs, kind, top k, with log-sum-exp, with draws, whole rows beside the top k)
  std::map<std::tuple<int64_t, int64_t, OutputKind, int32_t, bool, bool, int64_t>, std::unique_ptr<Step>> steps_;
  std::vector<std::unique_ptr<Buffer>> arenas_;  // per backend, sized to the largest plan
  std::vector<std::vector<uint8_t>> copy_staging_;  // per rank: device-to-device copies
  SplitStats split_stats_;
  int last_splits_ = 0, last_copies_ = 0;
  std::vector<float> logits_;
  std::vector<float> hidden_;      // kHidden steps: n_outputs x n_embd
  std::vector<float> top_;         // top-k steps: n_outputs x (2k + 1 (+ 2 with draws))
  int32_t top_k_ = 0;              // of the last step
  bool top_drawn_ = false;         // the last step drew tokens
  std::vector<int32_t> logits_row_;  // top-k steps: output -> its row in logits_ (-1: none)
  Step* last_step_ = nullptr;        // top-k steps: the last one (fetch_logits)
  std::vector<float> fetched_;       // fetch_logits' rows, in the order fetched since the step
  std::vector<int32_t> fetched_slot_;  // per output of the last step: its row in fetched_ (-1: none)
  std::vector<size_t> fetch_outputs_, fetch_offsets_;  // fetch_logits scratch
  std::vector<float> all_logits_;  // eval(all_logits): every token's logits
  std::vector<int32_t> staging_;   // step inputs, staged on the host (reused: no allocation per token)
  std::vector<int32_t> draw_staging_;
  std::vector<uint8_t> upload_image_;  // a run of a backend's step inputs, laid out as in its arena
  std::vector<Placed> upload_pieces_;
  std::vector<int64_t> added_, next_pos_;
  std::vector<BatchToken> eval_batch_;
  size_t n_outputs_ = 0;
  bool logits_from_eval_ = false;
  bool last_built_graph_ = false;
};

}  // namespace kite
