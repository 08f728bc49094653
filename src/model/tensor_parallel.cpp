// Splitting a model's layers over the ranks of a tensor-parallel group (model.h, TpRank).
#include <cstring>

#include "src/model/model.h"

namespace kite {
namespace {

// Rows [r * m / W, (r + 1) * m / W) of w [k, m]: the same bytes (column-parallel weights split
// by output feature; 1-D biases by element).
std::unique_ptr<Tensor> output_rows(const Tensor& w, TpRank tp) {
  auto t = std::make_unique<Tensor>(w);
  const int dim = w.ne[1] > 1 ? 1 : 0;  // (a 1-D bias is split along its only dimension)
  t->ne[dim] = w.ne[dim] / tp.world;
  t->data = static_cast<uint8_t*>(w.data) + static_cast<size_t>(tp.rank) * static_cast<size_t>(t->ne[dim]) * w.nb[dim];
  t->nb = contiguous_strides(t->type, t->ne);
  t->name = w.name + ".tp" + std::to_string(tp.rank);
  return t;
}

// Columns [r * k / W, (r + 1) * k / W) of every row of w [k, m] (row-parallel weights): a
// contiguous copy, since the slice of each row is whole blocks but the rows are apart.
std::unique_ptr<Tensor> input_columns(const Tensor& w, TpRank tp, std::vector<uint8_t>& bytes) {
  auto t = std::make_unique<Tensor>(w);
  t->ne[0] = w.ne[0] / tp.world;
  t->nb = contiguous_strides(t->type, t->ne);
  const size_t row = t->row_bytes(), at = row * static_cast<size_t>(tp.rank);
  bytes.resize(row * static_cast<size_t>(w.ne[1]));
  for (int64_t j = 0; j < w.ne[1]; ++j)
    std::memcpy(bytes.data() + static_cast<size_t>(j) * row, static_cast<const uint8_t*>(w.data) + static_cast<size_t>(j) * w.nb[1] + at, row);
  t->data = bytes.data();
  t->name = w.name + ".tp" + std::to_string(tp.rank);
  return t;
}

}  // namespace

HParams Model::rank_hparams(int32_t world) const {
  HParams hp = hp_;
  hp.n_head /= world;
  hp.n_head_kv /= world;
  hp.n_ff /= world;
  return hp;
}

Status Model::check_tensor_parallel(int32_t world) const {
  if (world < 1) return make_error("tensor parallelism: ", world, " ranks (expected 1 or more)");
  if (world == 1) return ok_status();
  if (hp_.n_expert > 0) return make_error("tensor parallelism: not supported for mixture-of-experts models (yet)");
  auto divides = [&](int64_t v, const char* what) -> Status {
    if (v % world == 0) return ok_status();
    return make_error("tensor parallelism over ", world, " ranks: the model's ", what, " (", v,
                      ") is not divisible by ", world);
  };
  KITE_TRY(divides(hp_.n_head, "attention heads"));
  KITE_TRY(divides(hp_.n_head_kv, "KV heads"));
  KITE_TRY(divides(hp_.n_ff, "feed-forward width"));
  for (const LayerWeights& l : layers_)
    for (const Tensor* w : {l.wo, l.w_down}) {
      const quant::TypeTraits* tr = quant::find_traits(w->type);
      const int64_t cols = w->ne[0] / world;
      if (cols % tr->block_size != 0)
        return make_error("tensor parallelism over ", world, " ranks: ", w->name, " (", tr->name, ", blocks of ",
                          tr->block_size, ") cannot be split into slices of ", cols, " columns");
    }
  return ok_status();
}

const std::vector<LayerWeights>& Model::layers_for(TpRank tp) const {
  if (tp.world <= 1) return layers_;
  std::lock_guard<std::mutex> lock(shards_mu_);
  std::unique_ptr<Shard>& s = shards_[{tp.rank, tp.world}];
  if (s) return s->layers;
  s = std::make_unique<Shard>();
  auto keep = [&](std::unique_ptr<Tensor> t) {
    s->tensors.push_back(std::move(t));
    return s->tensors.back().get();
  };
  auto rows = [&](const Tensor* w) { return w == nullptr ? nullptr : keep(output_rows(*w, tp)); };
  auto cols = [&](const Tensor* w) { return keep(input_columns(*w, tp, s->bytes.emplace_back())); };
  for (const LayerWeights& l : layers_) {
    LayerWeights r = l;  // norms (and qwen3's per-head Q/K norms) are whole
    r.wq = rows(l.wq), r.wk = rows(l.wk), r.wv = rows(l.wv);
    r.bq = rows(l.bq), r.bk = rows(l.bk), r.bv = rows(l.bv);
    r.w_gate = rows(l.w_gate), r.w_up = rows(l.w_up);
    r.wo = cols(l.wo), r.w_down = cols(l.w_down);
    s->layers.push_back(r);
  }
  return s->layers;
}

}  // namespace kite
