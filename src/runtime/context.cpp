#include "src/runtime/context.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace kite {

struct Context::Step {
  Graph graph;
  ForwardInputs in;
  Tensor* out = nullptr;           // logits [n_vocab, n_outputs] or hidden state [n_embd, n_outputs]
  std::vector<Backend*> backends;  // what the split's backend indices name
  SplitGraph split;                // backends of the nodes, copies at the boundaries, memory plans
  std::vector<std::unique_ptr<Step>> peers;  // tensor parallelism: ranks 1.. (this step is rank 0)
  Tensor* draws = nullptr;         // I32 [4, n_outputs]: RowDraws, packed (top-k steps that draw)
  Tensor* whole_ids = nullptr;     // I32 [n_whole]: OutputTopK::whole_rows
  Tensor* whole = nullptr;         // F32 [n_vocab, n_whole]: those outputs' logits
  Tensor* logits = nullptr;        // top-k steps: the logits, kept to the end (fetch_logits)
};

namespace {
constexpr size_t kMiB = size_t{1} << 20;
}  // namespace

Context::Context() = default;
Context::~Context() = default;

Result<std::unique_ptr<Context>> Context::create(std::shared_ptr<const Model> model, const ContextOptions& opts) {
  std::unique_ptr<Context> c(new Context());
  c->model_ = std::move(model);
  c->opts_ = opts;
  KITE_TRY(c->open_backends());
  KITE_TRY(c->check_device_memory());
  KvCacheOptions ko;
  ko.n_ctx = opts.n_ctx;
  ko.n_seqs = opts.n_seqs;
  ko.type = opts.kv_type;
  ko.n_blocks = opts.kv_blocks;
  ko.block_size = opts.kv_block_size;
  ko.prefix_cache = opts.prefix_cache;
  std::vector<Backend*> layer_backends;
  const int32_t world = std::max(opts.tensor_parallel, 1);
  for (int32_t r = 0; r < world; ++r)  // (tensor parallelism: each rank's KV heads on its backend)
    for (int64_t il = 0; il < c->model_->hparams().n_layer; ++il)
      layer_backends.push_back(
          c->backend_ptrs_[world > 1 ? static_cast<size_t>(r) : static_cast<size_t>(c->placement_(static_cast<int32_t>(il)))]);
  const HParams hp = world > 1 ? c->model_->rank_hparams(world) : c->model_->hparams();
  KITE_ASSIGN_OR_RETURN(c->kv_, KvCache::create(hp, ko, layer_backends));
  c->arenas_.resize(c->backends_.size());
  c->copy_staging_.resize(c->backends_.size());
  return c;
}

// One backend (gpu_layers -1: `device`; 0: the CPU), or the CPU plus `device` with the last
// gpu_layers layers and the output head on the device.
Status Context::open_backends() {
  BackendOptions bo;
  bo.n_threads = opts_.n_threads;
  const int64_t n_layer = model_->hparams().n_layer;
  if (const int32_t world = opts_.tensor_parallel; world != 1) {
    // Tensor parallelism: one backend per rank, every layer on each (its slice).
    if (world < 1) return make_error("tensor_parallel must be 1 or more ranks, got ", world);
    if (opts_.placement || opts_.gpu_layers >= 0)
      return make_error("tensor parallelism runs every layer on every rank: it cannot be combined with --gpu-layers");
    if (!opts_.dump_ops.empty() || opts_.op_observer)
      return make_error("tensor parallelism does not support --dump-ops or op observers (imatrix)");
    KITE_TRY(model_->check_tensor_parallel(world));
    const std::string kind = opts_.device.substr(0, opts_.device.find(':'));
    KITE_ASSIGN_OR_RETURN(comm_, create_communicator(kind, world));
    // CPU ranks share the threads asked for (0: the CPU backend splits the physical cores).
    bo.n_threads = opts_.n_threads > 0 ? std::max(1, opts_.n_threads / world) : 0;
    bo.comm = comm_.get();
    for (int32_t r = 0; r < world; ++r) {
      bo.rank = r;
      bo.device = r;
      KITE_ASSIGN_OR_RETURN(auto b, create_backend(kind, bo));
      backends_.push_back(std::move(b));
    }
    for (auto& b : backends_) backend_ptrs_.push_back(b.get());
    placement_ = [](int32_t) { return 0; };
    rank_threads_ = std::make_unique<ThreadTeam>(world);
    return ok_status();
  }
  int32_t n = opts_.gpu_layers;
  if (!opts_.placement && n < kGpuLayersAuto)
    return make_error("gpu_layers must be -1 (every layer), -2 (as many as fit) or a layer count >= 0, got ", n);
  std::unique_ptr<Backend> dev;
  if (!opts_.placement && n == kGpuLayersAuto) {  // as many of the last layers as fit
    KITE_ASSIGN_OR_RETURN(dev, create_backend(opts_.device, bo));
    n = layers_that_fit(*dev);
    auto_layers_ = n;
    if (n == 0) dev.reset();  // (not even the head: all on the CPU)
  }
  const bool split = opts_.placement || n > 0;
  if (split) {
    KITE_ASSIGN_OR_RETURN(auto cpu, create_backend("cpu", bo));
    backends_.push_back(std::move(cpu));
  }
  if (split || n < 0) {
    if (!dev) {
      KITE_ASSIGN_OR_RETURN(dev, create_backend(opts_.device, bo));
    }
    backends_.push_back(std::move(dev));
  } else {
    KITE_ASSIGN_OR_RETURN(auto cpu, create_backend("cpu", bo));
    backends_.push_back(std::move(cpu));
  }
  // An MoE model's experts run on the CPU, beside each layer's attention on the device, with
  // cpu_moe or where the device has no kernels for their type (SplitGraph's fallback): a CPU
  // backend joins a whole-model device context.
  const bool whole_on_device = !split && n < 0;
  if (!backends_.back()->is_host() && model_->hparams().n_expert > 0 &&
      (opts_.cpu_moe || !experts_supported(*backends_.back()))) {
    if (whole_on_device) {
      KITE_ASSIGN_OR_RETURN(auto cpu, create_backend("cpu", bo));
      backends_.insert(backends_.begin(), std::move(cpu));
    }
    fallback_ = 0;
  }
  for (auto& b : backends_) backend_ptrs_.push_back(b.get());
  if (whole_on_device && fallback_ == 0) {
    placement_ = [](int32_t) { return 1; };
  } else if (opts_.placement) {
    placement_ = opts_.placement;
    for (int32_t l = -1; l <= static_cast<int32_t>(n_layer); ++l)
      if (const int b = placement_(l); b < 0 || b > 1)
        return make_error("placement: model part ", l, " is placed on backend ", b, " (expected 0: cpu or 1: ",
                          opts_.device, ")");
  } else if (split) {
    const int64_t first = n_layer - std::min<int64_t>(n, n_layer);  // the first layer on the device
    placement_ = [first](int32_t layer) { return layer >= first ? 1 : 0; };
  } else {
    placement_ = [](int32_t) { return 0; };
  }
  return ok_status();
}

// The KV cache's blocks and block size as KvCache::create will make them; 0 blocks where the
// options are invalid (KvCache::create names the problem).
std::pair<int64_t, int64_t> Context::kv_blocks() const {
  const int64_t bs = opts_.kv_block_size > 0 ? opts_.kv_block_size : 1;
  const int64_t n_blocks = opts_.kv_blocks > 0 ? opts_.kv_blocks : (opts_.n_ctx + bs - 1) / bs * opts_.n_seqs;
  if (quant::find_traits(opts_.kv_type) == nullptr) return {0, bs};
  return {std::max<int64_t>(n_blocks, 0), bs};
}

// Bytes `dev` would hold with the last k layers (k > 0: and the output head; `embedding`: and
// the token embedding, the whole model when k is n_layer) on it: their weights (less any it
// already holds) and their KV cache.
size_t Context::device_bytes(const Backend& dev, int64_t k, bool embedding) const {
  const HParams& hp = model_->hparams();
  const auto [n_blocks, bs] = kv_blocks();
  const size_t kv_layer =
      n_blocks > 0 ? KvCache::layer_bytes(hp, opts_.kv_type, static_cast<int32_t>(bs), n_blocks) : 0;
  const int64_t first = hp.n_layer - k;
  return model_->weight_bytes([&](int32_t l) { return (k > 0 && l >= first) || (embedding && l < 0); },
                              [&](const Tensor& t) { return dev.holds_weight(t) || on_cpu(dev, t); }) +
         static_cast<size_t>(k) * kv_layer;
}

// Whether `dev` runs the model's experts (mul_mat_id of its expert weights' type; true for a
// dense model).
bool Context::experts_supported(const Backend& dev) const {
  const TensorInfo* w = model_->source().find_tensor("blk.0.ffn_up_exps.weight");
  if (w == nullptr || w->ne.size() != 3) return true;
  Graph g;
  Tensor* we = g.input(w->type, {w->ne[0], w->ne[1], w->ne[2]}, "w");
  Tensor* x = g.input(DType::F32, {w->ne[0], 1, 1}, "x");
  Tensor* route = g.input(DType::F32, {3, 1}, "route");
  return dev.supports(*g.mul_mat_id(we, x, route, 1));
}

// Weights that `dev` does not hold though their layer is placed on it: experts that run on
// the CPU (cpu_moe, or `dev` has no kernels for them: open_backends).
bool Context::on_cpu(const Backend& dev, const Tensor& t) const {
  return !dev.is_host() && Model::is_expert_weight(t) && (opts_.cpu_moe || !experts_supported(dev));
}

// --gpu-layers auto: -1 where the whole model fits in `dev`'s free memory (or `dev` has none of
// its own), else the most of the last layers that fit (0: not even the head), each time leaving
// a tenth of the free memory (at most 1 GiB) to activations and the kernels' scratch.
int32_t Context::layers_that_fit(const Backend& dev) const {
  const std::optional<MemoryInfo> mem = dev.memory_info();
  if (!mem) return -1;
  const size_t budget = mem->free - std::min(mem->free / 10, size_t{1} << 30);
  const int64_t n_layer = model_->hparams().n_layer;
  if (device_bytes(dev, n_layer, true) <= budget) return -1;
  int64_t k = n_layer;
  while (k > 0 && device_bytes(dev, k) > budget) --k;
  return static_cast<int32_t>(k);
}

// Before anything is mirrored or allocated: the weights and KV each device will hold against its
// free memory, so a model that does not fit is an error at load, not mid-request.
Status Context::check_device_memory() const {
  const HParams& hp = model_->hparams();
  const auto [n_blocks, bs] = kv_blocks();
  if (n_blocks <= 0) return ok_status();  // KvCache::create names the problem
  if (const int32_t world = opts_.tensor_parallel; world > 1) {
    // Each rank: its slices of every layer, the whole embedding and head, its KV heads.
    const size_t kv_rank = KvCache::layer_bytes(model_->rank_hparams(world), opts_.kv_type, static_cast<int32_t>(bs),
                                                n_blocks) * static_cast<size_t>(hp.n_layer);
    for (int32_t r = 0; r < world; ++r) {
      const Backend& be = *backends_[static_cast<size_t>(r)];
      const std::optional<MemoryInfo> mem = be.memory_info();
      if (!mem) continue;
      const size_t weights = model_->weight_bytes([](int32_t) { return true; },
                                                  [&](const Tensor& t) { return be.holds_weight(t); }, TpRank{r, world});
      if (weights + kv_rank <= mem->free) continue;
      return make_error(be.name(), ": the model does not fit in device memory over ", world, " ranks: rank ", r,
                        " needs ", (weights + kv_rank) / kMiB, " MiB (weights ", weights / kMiB, " MiB, KV cache ",
                        kv_rank / kMiB, " MiB), but only ", mem->free / kMiB, " MiB of ", mem->total / kMiB,
                        " MiB are free; use more ranks or shrink the KV cache (--ctx, --kv-memory)");
    }
    return ok_status();
  }
  const size_t kv_layer = KvCache::layer_bytes(hp, opts_.kv_type, static_cast<int32_t>(bs), n_blocks);
  for (size_t b = 0; b < backends_.size(); ++b) {
    const std::optional<MemoryInfo> mem = backends_[b]->memory_info();
    if (!mem) continue;
    // (Weights the device already holds for another context cost nothing more.)
    auto held = [&](const Tensor& t) { return backends_[b]->holds_weight(t) || on_cpu(*backends_[b], t); };
    // Bytes the device holds when the parts that `on` selects run there.
    auto need = [&](const std::function<bool(int32_t)>& on, int64_t* layers) {
      int64_t n = 0;
      for (int32_t l = 0; l < hp.n_layer; ++l) n += on(l) ? 1 : 0;
      if (layers != nullptr) *layers = n;
      return model_->weight_bytes(on, held) + static_cast<size_t>(n) * kv_layer;
    };
    int64_t layers = 0;
    const size_t weights =
        model_->weight_bytes([&](int32_t l) { return placement_(l) == static_cast<int>(b); }, held);
    const size_t total = need([&](int32_t l) { return placement_(l) == static_cast<int>(b); }, &layers);
    if (total <= mem->free) continue;
    // The largest gpu_layers that would fit (last k layers and the head on the device).
    int64_t fits = std::min<int64_t>(layers, hp.n_layer) - 1;
    while (fits > 0 && device_bytes(*backends_[b], fits) > mem->free) --fits;
    return make_error(backends_[b]->name(), ": the model does not fit in device memory: ", layers, " of ",
                      hp.n_layer, " layers need ", total / kMiB, " MiB (weights ", weights / kMiB, " MiB, KV cache ",
                      (total - weights) / kMiB, " MiB), but only ", mem->free / kMiB, " MiB of ", mem->total / kMiB,
                      " MiB are free; run fewer layers on the device (--gpu-layers ", std::max<int64_t>(fits, 0),
                      " would fit; --gpu-layers auto picks as many as fit) or shrink the KV cache (--ctx, "
                      "--kv-memory)");
  }
  return ok_status();
}

Result<Context::Step*> Context::step_for(int64_t n_tokens, int64_t n_outputs, OutputKind kind, OutputTopK top_k) {
  const int64_t n_whole = top_k.k > 0 ? static_cast<int64_t>(top_k.whole_rows.size()) : 0;
  auto key = std::make_tuple(n_tokens, n_outputs, kind, top_k.k, top_k.log_sum_exp, !top_k.draws.empty(), n_whole);
  auto it = steps_.find(key);
  last_built_graph_ = it == steps_.end();
  const int32_t world = std::max(opts_.tensor_parallel, 1);
  if (it == steps_.end()) {
    // Continuous batching meets many shapes; keep the cache of built graphs bounded.
    if (steps_.size() >= 256) steps_.clear();
    // Rank r's graph (rank 0 without tensor parallelism, over every backend).
    auto build = [&](int32_t r) -> Result<std::unique_ptr<Step>> {
      auto s = std::make_unique<Step>();
      Graph& g = s->graph;
      s->in.tokens = g.input(DType::I32, {n_tokens}, "tokens");
      s->in.positions = g.input(DType::I32, {n_tokens}, "positions");
      s->in.token_seq = g.input(DType::I32, {n_tokens}, "token_seq");
      s->in.kv_slots = g.input(DType::I32, {n_tokens}, "kv_slots");
      s->in.block_table = g.input(DType::I32, {kv_->max_blocks_per_seq(), kv_->n_seqs()}, "block_table");
      s->in.out_rows = g.input(DType::I32, {n_outputs}, "out_rows");
      // (Ranks past 0 stop at the hidden state: only rank 0's output is read.)
      s->out = model_->build_forward(g, s->in, kv_->tensors(static_cast<size_t>(r)), r == 0 ? kind : OutputKind::kHidden,
                                     TpRank{r, world});
      if (r == 0 && top_k.k > 0) {  // (with the output head: on the backend that computed the logits)
        g.set_layer(static_cast<int32_t>(model_->hparams().n_layer));
        Tensor* logits = s->logits = s->out;
        if (!top_k.draws.empty()) s->draws = g.input(DType::I32, {4, n_outputs}, "draws");
        s->out = g.top_k(logits, top_k.k, top_k.log_sum_exp, s->draws);
        g.build(s->out);
        g.build(logits);  // (an output: nothing after it reuses its memory)
        if (n_whole > 0) {  // (gathered into one tensor: one download)
          s->whole_ids = g.input(DType::I32, {n_whole}, "whole_rows");
          s->whole = g.get_rows(logits, s->whole_ids);
          g.build(s->whole);
        }
      }
      if (world > 1) s->backends = {backend_ptrs_[static_cast<size_t>(r)]};
      else s->backends = backend_ptrs_;
      std::function<bool(const Tensor&)> experts;  // (--cpu-moe: even where the device runs them)
      if (opts_.cpu_moe) experts = [](const Tensor& n) { return n.op == Op::kMulMatId || n.op == Op::kMoeSum; };
      KITE_ASSIGN_OR_RETURN(s->split,
                            SplitGraph::make(g, s->backends, placement_, world > 1 ? -1 : fallback_, experts));
      for (const GraphSplit& sp : s->split.splits()) {
        const Backend& be = *s->backends[static_cast<size_t>(sp.backend)];
        for (const Tensor* n : sp.nodes)
          if (!be.supports(*n))
            return make_error(be.name(), ": op ", op_name(n->op), " on ", n->name, " (",
                              quant::find_traits(n->src[0] ? n->src[0]->type : n->type)->name, ") is not supported");
      }
      return s;
    };
    KITE_ASSIGN_OR_RETURN(std::unique_ptr<Step> s, build(0));
    for (int32_t r = 1; r < world; ++r) {
      KITE_ASSIGN_OR_RETURN(std::unique_ptr<Step> peer, build(r));
      s->peers.push_back(std::move(peer));
    }
    it = steps_.emplace(key, std::move(s)).first;
  }
  Step* s = it->second.get();
  // Arenas: per backend (each rank's backend is its graph's only one).
  for (int32_t r = 0; r < world; ++r) {
    Step* rs = r == 0 ? s : s->peers[static_cast<size_t>(r - 1)].get();
    for (size_t b = 0; b < rs->backends.size(); ++b) {
      const size_t bytes = rs->split.arena_bytes(static_cast<int>(b));
      if (bytes == 0) continue;
      const size_t a = world > 1 ? static_cast<size_t>(r) : b;
      if (!arenas_[a] || arenas_[a]->size() < bytes) {
        arenas_[a].reset();
        KITE_ASSIGN_OR_RETURN(arenas_[a], backends_[a]->alloc(bytes));
      }
      rs->split.place(static_cast<int>(b), static_cast<uint8_t*>(arenas_[a]->base()));
    }
  }
  last_splits_ = static_cast<int>(s->split.splits().size());
  last_copies_ = s->split.n_copies();
  return s;
}

Status Context::decode(std::span<const BatchToken> batch, OutputKind kind, OutputTopK top_k) {
  if (batch.empty()) return make_error("decode: empty batch");
  if (top_k.k != 0 && (kind != OutputKind::kLogits || top_k.k < 0 || top_k.k > kMaxTopK))
    return make_error("decode: top-k outputs are for logits, with k in [1, ", kMaxTopK, "], got ", top_k.k);
  const HParams& hp = model_->hparams();
  std::vector<int64_t>& added = added_;
  added.assign(static_cast<size_t>(kv_->n_seqs()), 0);
  int64_t n_out = 0;
  for (const BatchToken& t : batch) {
    if (t.seq < 0 || t.seq >= kv_->n_seqs()) return make_error("decode: sequence ", t.seq, " out of range");
    if (t.token < 0 || t.token >= hp.n_vocab)
      return make_error("decode: token id ", t.token, " is outside the vocabulary (", hp.n_vocab, " tokens)");
    ++added[static_cast<size_t>(t.seq)];
    n_out += t.logits ? 1 : 0;
  }
  if (n_out == 0) n_out = 1;  // the graph always ends in an output; keep the last token's
  if (!top_k.draws.empty() && top_k.draws.size() != static_cast<size_t>(n_out))
    return make_error("decode: ", top_k.draws.size(), " draws for ", n_out, " outputs");
  if (!top_k.whole_rows.empty()) {
    if (top_k.k == 0) return make_error("decode: whole rows are asked for beside top-k outputs, without top_k.k");
    for (size_t i = 0; i < top_k.whole_rows.size(); ++i)
      if (top_k.whole_rows[i] < 0 || top_k.whole_rows[i] >= n_out || (i > 0 && top_k.whole_rows[i] <= top_k.whole_rows[i - 1]))
        return make_error("decode: whole rows must be ascending outputs in [0, ", n_out, "), got ", top_k.whole_rows[i]);
  }
  for (int32_t s = 0; s < kv_->n_seqs(); ++s)
    if (added[static_cast<size_t>(s)] > 0) KITE_TRY(kv_->reserve(s, added[static_cast<size_t>(s)]));

  KITE_ASSIGN_OR_RETURN(Step * step, step_for(static_cast<int64_t>(batch.size()), n_out, kind, top_k));
  // Inputs are staged on the host and uploaded, so device backends work the same way.
  const size_t n = batch.size();
  staging_.assign(5 * n + static_cast<size_t>(kv_->max_blocks_per_seq()) * static_cast<size_t>(kv_->n_seqs()), 0);
  int32_t* tokens = staging_.data();
  int32_t* pos = tokens + n;
  int32_t* seq = pos + n;
  int32_t* slots = seq + n;
  int32_t* out = slots + n;
  int32_t* table = out + n;
  next_pos_.resize(static_cast<size_t>(kv_->n_seqs()));
  for (int32_t s = 0; s < kv_->n_seqs(); ++s) next_pos_[static_cast<size_t>(s)] = kv_->seq_len(s);
  int64_t o = 0;
  for (size_t i = 0; i < n; ++i) {
    const BatchToken& t = batch[i];
    const int64_t p = next_pos_[static_cast<size_t>(t.seq)]++;
    tokens[i] = t.token;
    pos[i] = static_cast<int32_t>(p);
    seq[i] = t.seq;
    slots[i] = kv_->slot(t.seq, p);
    if (t.logits) out[o++] = static_cast<int32_t>(i);
  }
  if (o == 0) out[o++] = static_cast<int32_t>(n - 1);
  kv_->fill_block_table(table);
  if (!top_k.draws.empty()) {
    draw_staging_.resize(4 * top_k.draws.size());
    for (size_t i = 0; i < top_k.draws.size(); ++i)
      pack_draw(top_k.draws[i].temperature, top_k.draws[i].u, &draw_staging_[4 * i]);
  }
  // Every backend that reads an input gets its own copy of it (every rank's graph too), and a
  // backend's inputs go up together: the planner places its leaves first, at the start of its
  // arena (MemoryPlan), so they lie side by side there and one copy carries them (a run per
  // stretch of them: other leaves, such as split copies' destinations, may lie between).
  const size_t row = n * sizeof(int32_t);
  for (size_t r = 0; r <= step->peers.size(); ++r) {
    Step& rs = r == 0 ? *step : *step->peers[r - 1];
    const UploadPiece inputs[] = {{rs.in.tokens, tokens, row},
                                  {rs.in.positions, pos, row},
                                  {rs.in.token_seq, seq, row},
                                  {rs.in.kv_slots, slots, row},
                                  {rs.in.out_rows, out, static_cast<size_t>(o) * sizeof(int32_t)},
                                  {rs.in.block_table, table, rs.in.block_table->nbytes()},
                                  {rs.draws, draw_staging_.data(), rs.draws ? rs.draws->nbytes() : 0},
                                  {rs.whole_ids, top_k.whole_rows.data(), top_k.whole_rows.size_bytes()}};
    for (size_t b = 0; b < rs.backends.size(); ++b) KITE_TRY(upload_inputs(rs, b, inputs));
  }
  Backend& out_be = *step->backends[static_cast<size_t>(step->split.backend_of(step->out))];
  KITE_TRY(compute(*step, &out_be));
  n_outputs_ = static_cast<size_t>(o);
  std::vector<float>& dst = kind == OutputKind::kHidden ? hidden_ : top_k.k > 0 ? top_ : logits_;
  dst.resize(n_outputs_ * static_cast<size_t>(step->out->ne[0]));
  KITE_TRY(out_be.download(*step->out, dst.data(), dst.size() * sizeof(float)));
  logits_row_.clear();
  if (step->whole != nullptr) {  // (on out_be too: the output head's backend)
    logits_.resize(top_k.whole_rows.size() * static_cast<size_t>(hp.n_vocab));
    KITE_TRY(out_be.download(*step->whole, logits_.data(), logits_.size() * sizeof(float)));
    logits_row_.assign(n_outputs_, -1);
    for (size_t i = 0; i < top_k.whole_rows.size(); ++i) logits_row_[static_cast<size_t>(top_k.whole_rows[i])] = static_cast<int32_t>(i);
  }
  for (const BatchToken& t : batch) kv_->advance(t.seq, std::span<const int32_t>(&t.token, 1));
  if (kind == OutputKind::kLogits) logits_from_eval_ = false;
  top_k_ = top_k.k;
  top_drawn_ = !top_k.draws.empty();
  last_step_ = top_k.k > 0 ? step : nullptr;
  fetched_slot_.clear();
  fetched_.clear();
  return ok_status();
}

Status Context::upload_inputs(Step& step, size_t b, std::span<const UploadPiece> inputs) {
  std::vector<Placed>& at = upload_pieces_;  // where each input's replica on backend b lies
  at.clear();
  for (const UploadPiece& in : inputs)
    if (in.input != nullptr)
      for (const auto& [rb, t] : step.split.replicas(in.input))
        if (static_cast<size_t>(rb) == b) at.push_back({static_cast<uint8_t*>(t->data), &in});
  std::sort(at.begin(), at.end(), [](const Placed& x, const Placed& y) { return x.p < y.p; });
  constexpr size_t kMaxGap = 4096;  // bytes of other leaves a run carries rather than split
  for (size_t first = 0; first < at.size();) {
    size_t last = first;
    uint8_t* end = at[first].p + at[first].in->bytes;
    while (last + 1 < at.size() && at[last + 1].p <= end + kMaxGap) {
      ++last;
      end = std::max(end, at[last].p + at[last].in->bytes);
    }
    upload_image_.assign(static_cast<size_t>(end - at[first].p), 0);
    for (size_t i = first; i <= last; ++i)
      std::memcpy(upload_image_.data() + (at[i].p - at[first].p), at[i].in->data, at[i].in->bytes);
    Tensor run;  // (bytes of the arena)
    run.type = DType::I8;
    run.ne = {end - at[first].p, 1, 1, 1};
    run.nb = contiguous_strides(run.type, run.ne);
    run.data = at[first].p;
    run.name = "step inputs";
    KITE_TRY(step.backends[b]->upload(run, upload_image_.data(), upload_image_.size()));
    first = last + 1;
  }
  return ok_status();
}

Status Context::compute(Step& step, const Backend* downloads_next) {
  if (!step.peers.empty()) {
    // Every rank at once (their all_reduce nodes meet in the communicator). A rank that fails
    // aborts the group, so none waits for it; the first rank's own error is reported.
    std::vector<Status> status(step.peers.size() + 1);
    rank_threads_->run([&](int r) {
      Step& rs = r == 0 ? step : *step.peers[static_cast<size_t>(r - 1)];
      Status st = rs.split.compute(rs.backends, copy_staging_[static_cast<size_t>(r)], r == 0 ? &split_stats_ : nullptr);
      for (Backend* b : rs.backends)
        if (st.ok()) st = b->synchronize();
      if (!st.ok()) comm_->abort("rank " + std::to_string(r) + " failed: " + st.error().message);
      status[static_cast<size_t>(r)] = std::move(st);
    });
    for (const Status& st : status)
      if (!st.ok()) {
        comm_->reset();
        for (const Status& own : status)  // (the others' are "all_reduce: rank r failed: ...")
          if (!own.ok() && own.error().message.rfind("all_reduce: ", 0) != 0) return own;
        return st;
      }
    return ok_status();
  }
  if (opts_.dump_ops.empty() && !opts_.op_observer) {
    KITE_TRY(step.split.compute(step.backends, copy_staging_[0], &split_stats_));
  } else {  // op by op (slower): dump and observe each node
    static int step_counter = 0;
    const int step_no = step_counter++;
    KITE_TRY(step.split.compute(step.backends, copy_staging_[0], &split_stats_, [&](Tensor& node, Backend& be) -> Status {
      if (opts_.op_observer) KITE_TRY(opts_.op_observer(node, be));
      if (opts_.dump_ops.empty()) return ok_status();
      const bool match = opts_.dump_ops == "*" || node.name.find(opts_.dump_ops) != std::string::npos ||
                         std::string(op_name(node.op)).find(opts_.dump_ops) != std::string::npos;
      return match ? dump_op(node, be, step_no) : ok_status();
    }));
  }
  for (Backend* b : step.backends)
    if (b != downloads_next) KITE_TRY(b->synchronize());
  return ok_status();
}

Status Context::dump_op(const Tensor& t, Backend& backend, int step_no) {
  const Tensor* n = &t;
  KITE_TRY(backend.synchronize());
  // Statistics over the tensor as F32 (row by row, any storage type).
  std::vector<uint8_t> bytes(n->nbytes());
  KITE_TRY(backend.download(*n, bytes.data(), bytes.size()));
  double sum = 0, sum2 = 0;
  float mn = INFINITY, mx = -INFINITY;
  int64_t nan = 0;
  std::vector<float> all;
  std::vector<float> row(static_cast<size_t>(n->ne[0]));
  for (int64_t r = 0; r < n->n_rows(); ++r) {
    const int64_t i1 = r % n->ne[1], i2 = (r / n->ne[1]) % n->ne[2], i3 = r / (n->ne[1] * n->ne[2]);
    const uint8_t* p = bytes.data() + i1 * n->nb[1] + i2 * n->nb[2] + i3 * n->nb[3];
    quant::find_traits(n->type)->dequantize ? quant::find_traits(n->type)->dequantize(p, row.data(), n->ne[0])
                                            : (void)std::memcpy(row.data(), p, row.size() * 4);
    for (float v : row) {
      if (std::isnan(v)) { ++nan; continue; }
      sum += v, sum2 += double(v) * v, mn = std::min(mn, v), mx = std::max(mx, v);
    }
    if (!opts_.dump_dir.empty()) all.insert(all.end(), row.begin(), row.end());
  }
  const double cnt = static_cast<double>(n->n_elements() - nan);
  std::fprintf(stderr, "[dump] %-10s %-16s [%lld, %lld, %lld, %lld] mean %+.6f rms %.6f min %+.6f max %+.6f nan %lld\n",
               op_name(n->op), n->name.c_str(), static_cast<long long>(n->ne[0]), static_cast<long long>(n->ne[1]),
               static_cast<long long>(n->ne[2]), static_cast<long long>(n->ne[3]), cnt > 0 ? sum / cnt : 0.0,
               cnt > 0 ? std::sqrt(sum2 / cnt) : 0.0, mn, mx, static_cast<long long>(nan));
  if (!opts_.dump_dir.empty()) {
    const std::string path = opts_.dump_dir + "/" + std::to_string(step_no) + "." + n->name + ".f32";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return make_error("--dump-ops: cannot write ", path);
    std::fwrite(all.data(), sizeof(float), all.size(), f);
    std::fclose(f);
  }
  return ok_status();
}

std::span<const float> Context::logits(size_t i) const {
  const size_t nv = static_cast<size_t>(model_->hparams().n_vocab);
  if (logits_from_eval_) return {all_logits_.data() + i * nv, nv};
  if (top_k_ > 0) {
    assert(has_logits(i));
    i = static_cast<size_t>(logits_row_[i]);
  }
  return {logits_.data() + i * nv, nv};
}

bool Context::has_logits(size_t i) const {
  if (logits_from_eval_ || top_k_ == 0) return i < n_outputs_;
  return i < logits_row_.size() && logits_row_[i] >= 0;
}

Result<std::span<const float>> Context::fetch_logits(size_t i) {
  if (has_logits(i)) return logits(i);
  if (i >= fetched_slot_.size() || fetched_slot_[i] < 0) KITE_TRY(fetch_logits(std::span<const size_t>(&i, 1)));
  const size_t nv = static_cast<size_t>(model_->hparams().n_vocab);
  return std::span<const float>(fetched_.data() + static_cast<size_t>(fetched_slot_[i]) * nv, nv);
}

Status Context::fetch_logits(std::span<const size_t> outputs) {
  for (size_t i : outputs)
    if (last_step_ == nullptr || i >= n_outputs_)
      return make_error("fetch_logits: output ", i, " of the last step has no row to fetch (", n_outputs_, " outputs)");
  fetch_outputs_.clear();
  for (size_t i : outputs) {
    if (has_logits(i) || (i < fetched_slot_.size() && fetched_slot_[i] >= 0)) continue;
    if (fetched_slot_.size() < n_outputs_) fetched_slot_.resize(n_outputs_, -1);
    fetched_slot_[i] = -2;  // (listed once)
    fetch_outputs_.push_back(i);
  }
  if (fetch_outputs_.empty()) return ok_status();
  const Tensor& all = *last_step_->logits;
  const size_t nv = static_cast<size_t>(all.ne[0]);
  const size_t slots = fetched_.size() / nv;  // rows already fetched since the step
  fetch_offsets_.clear();
  for (size_t i : fetch_outputs_) fetch_offsets_.push_back(i * all.nb[1]);
  fetched_.resize((slots + fetch_outputs_.size()) * nv);
  const Backend& be = *last_step_->backends[static_cast<size_t>(last_step_->split.backend_of(&all))];
  const Status st = be.download_many(all, fetch_offsets_, nv * sizeof(float), fetched_.data() + slots * nv);
  if (!st) fetched_.resize(slots * nv);
  for (size_t j = 0; j < fetch_outputs_.size(); ++j)
    fetched_slot_[fetch_outputs_[j]] = st ? static_cast<int32_t>(slots + j) : -1;
  return st;
}

TopLogits Context::top_logits(size_t i) const {
  const size_t k = static_cast<size_t>(top_k_), row = 2 * k + 1 + (top_drawn_ ? 2 : 0);
  const std::span<const float> r(top_.data() + i * row, row);
  if (!top_drawn_) return {r.first(k), r.subspan(k, k), r[2 * k]};
  return {r.first(k), r.subspan(k, k), r[2 * k], static_cast<int32_t>(r[2 * k + 1]), r[2 * k + 2]};
}

bool Context::supports_top_k(bool draw) const {
  // A node like the one a step would end in, on the backend that computes the logits.
  Graph g;
  Tensor* logits = g.input(DType::F32, {model_->hparams().n_vocab, 1}, "logits");
  Tensor* draws = draw ? g.input(DType::I32, {4, 1}, "draws") : nullptr;
  const Tensor* t = g.top_k(logits, kMaxTopK, true, draws);
  return backends_[static_cast<size_t>(placement_(static_cast<int32_t>(model_->hparams().n_layer)))]->supports(*t);
}

std::span<const float> Context::hidden(size_t i) const {
  const size_t ne = static_cast<size_t>(model_->hparams().n_embd);
  return {hidden_.data() + i * ne, ne};
}

Status Context::eval(std::span<const int32_t> tokens, int32_t seq, bool all_logits, size_t n_batch) {
  if (tokens.empty()) return make_error("eval: no tokens");
  const size_t nv = static_cast<size_t>(model_->hparams().n_vocab);
  if (all_logits) all_logits_.resize(tokens.size() * nv);
  std::vector<BatchToken>& batch = eval_batch_;
  for (size_t start = 0; start < tokens.size(); start += n_batch) {
    const size_t end = std::min(tokens.size(), start + n_batch);
    batch.clear();
    for (size_t i = start; i < end; ++i) batch.push_back({tokens[i], seq, all_logits || i + 1 == tokens.size()});
    KITE_TRY(decode(batch));
    if (all_logits) std::memcpy(all_logits_.data() + start * nv, logits_.data(), (end - start) * nv * sizeof(float));
  }
  if (all_logits) {
    n_outputs_ = tokens.size();
    logits_from_eval_ = true;
  }
  return ok_status();
}

}  // namespace kite
