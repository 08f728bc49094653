#include "src/runtime/context.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace kite {

struct Context::Step {
  Graph graph;
  ForwardInputs in;
  Tensor* out = nullptr;  // logits [n_vocab, n_outputs] or hidden state [n_embd, n_outputs]
  MemoryPlan plan;
};

Context::~Context() = default;

Result<std::unique_ptr<Context>> Context::create(std::shared_ptr<const Model> model, const ContextOptions& opts) {
  std::unique_ptr<Context> c(new Context());
  c->model_ = std::move(model);
  c->opts_ = opts;
  BackendOptions bo;
  bo.n_threads = opts.n_threads;
  KITE_ASSIGN_OR_RETURN(c->backend_, create_backend(opts.device, bo));
  KvCacheOptions ko;
  ko.n_ctx = opts.n_ctx;
  ko.n_seqs = opts.n_seqs;
  ko.type = opts.kv_type;
  ko.n_blocks = opts.kv_blocks;
  ko.block_size = opts.kv_block_size;
  ko.prefix_cache = opts.prefix_cache;
  KITE_ASSIGN_OR_RETURN(c->kv_, KvCache::create(c->model_->hparams(), ko, *c->backend_));
  return c;
}

Result<Context::Step*> Context::step_for(int64_t n_tokens, int64_t n_outputs, OutputKind kind) {
  auto key = std::make_tuple(n_tokens, n_outputs, kind);
  auto it = steps_.find(key);
  if (it == steps_.end()) {
    // Continuous batching meets many shapes; keep the cache of built graphs bounded.
    if (steps_.size() >= 256) steps_.clear();
    auto s = std::make_unique<Step>();
    Graph& g = s->graph;
    s->in.tokens = g.input(DType::I32, {n_tokens}, "tokens");
    s->in.positions = g.input(DType::I32, {n_tokens}, "positions");
    s->in.token_seq = g.input(DType::I32, {n_tokens}, "token_seq");
    s->in.kv_slots = g.input(DType::I32, {n_tokens}, "kv_slots");
    s->in.block_table = g.input(DType::I32, {kv_->max_blocks_per_seq(), kv_->n_seqs()}, "block_table");
    s->in.out_rows = g.input(DType::I32, {n_outputs}, "out_rows");
    s->out = model_->build_forward(g, s->in, kv_->tensors(), kind);
    for (Tensor* n : g.nodes())
      if (!backend_->supports(*n))
        return make_error(backend_->name(), ": op ", op_name(n->op), " on ", n->name, " (",
                          quant::find_traits(n->src[0] ? n->src[0]->type : n->type)->name, ") is not supported");
    s->plan = MemoryPlan::make(g);
    it = steps_.emplace(key, std::move(s)).first;
  }
  Step* s = it->second.get();
  if (!arena_ || arena_->size() < s->plan.arena_bytes()) {
    arena_.reset();
    KITE_ASSIGN_OR_RETURN(arena_, backend_->alloc(s->plan.arena_bytes()));
  }
  s->plan.place(s->graph, static_cast<uint8_t*>(arena_->base()));
  return s;
}

Status Context::decode(std::span<const BatchToken> batch, OutputKind kind) {
  if (batch.empty()) return make_error("decode: empty batch");
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
  for (int32_t s = 0; s < kv_->n_seqs(); ++s)
    if (added[static_cast<size_t>(s)] > 0) KITE_TRY(kv_->reserve(s, added[static_cast<size_t>(s)]));

  KITE_ASSIGN_OR_RETURN(Step * step, step_for(static_cast<int64_t>(batch.size()), n_out, kind));
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
  const size_t row = n * sizeof(int32_t);
  KITE_TRY(backend_->upload(*step->in.tokens, tokens, row));
  KITE_TRY(backend_->upload(*step->in.positions, pos, row));
  KITE_TRY(backend_->upload(*step->in.token_seq, seq, row));
  KITE_TRY(backend_->upload(*step->in.kv_slots, slots, row));
  KITE_TRY(backend_->upload(*step->in.out_rows, out, static_cast<size_t>(o) * sizeof(int32_t)));
  KITE_TRY(backend_->upload(*step->in.block_table, table, step->in.block_table->nbytes()));

  if (opts_.dump_ops.empty() && !opts_.op_observer) {
    KITE_TRY(backend_->compute(step->graph.nodes()));
  } else {
    KITE_TRY(compute_op_by_op(step->graph));
  }
  KITE_TRY(backend_->synchronize());
  for (const BatchToken& t : batch) kv_->advance(t.seq, std::span<const int32_t>(&t.token, 1));

  n_outputs_ = static_cast<size_t>(o);
  std::vector<float>& dst = kind == OutputKind::kHidden ? hidden_ : logits_;
  dst.resize(n_outputs_ * static_cast<size_t>(kind == OutputKind::kHidden ? hp.n_embd : hp.n_vocab));
  KITE_TRY(backend_->download(*step->out, dst.data(), dst.size() * sizeof(float)));
  if (kind == OutputKind::kLogits) logits_from_eval_ = false;
  return ok_status();
}

Status Context::compute_op_by_op(const Graph& g) {
  static int step_counter = 0;
  const int step_no = step_counter++;
  for (Tensor* n : g.nodes()) {
    KITE_TRY(backend_->compute(std::span<Tensor* const>(&n, 1)));
    if (n->op == Op::kView || n->op == Op::kKvWrite) continue;
    if (opts_.op_observer) {
      KITE_TRY(backend_->synchronize());
      KITE_TRY(opts_.op_observer(*n, *backend_));
    }
    if (opts_.dump_ops.empty()) continue;
    const bool match = opts_.dump_ops == "*" || n->name.find(opts_.dump_ops) != std::string::npos ||
                       std::string(op_name(n->op)).find(opts_.dump_ops) != std::string::npos;
    if (match) KITE_TRY(dump_op(*n, step_no));
  }
  return ok_status();
}

Status Context::dump_op(const Tensor& t, int step_no) {
  const Tensor* n = &t;
  KITE_TRY(backend_->synchronize());
  // Statistics over the tensor as F32 (row by row, any storage type).
  std::vector<uint8_t> bytes(n->nbytes());
  KITE_TRY(backend_->download(*n, bytes.data(), bytes.size()));
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
  const std::vector<float>& src = logits_from_eval_ ? all_logits_ : logits_;
  return {src.data() + i * nv, nv};
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
