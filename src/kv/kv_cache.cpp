#include "src/kv/kv_cache.h"

#include <cstring>

namespace kite {

Result<std::unique_ptr<KvCache>> KvCache::create(const HParams& hp, const KvCacheOptions& opts, Backend& backend) {
  if (opts.type != DType::F16 && opts.type != DType::F32 && opts.type != DType::BF16)
    return make_error("KV cache type must be f16, bf16 or f32");
  if (opts.n_ctx <= 0 || opts.n_seqs <= 0 || opts.block_size <= 0)
    return make_error("KV cache: context, sequences and block size must be positive");
  auto kv = std::unique_ptr<KvCache>(new KvCache());
  kv->opts_ = opts;
  kv->max_blocks_ = static_cast<int32_t>((opts.n_ctx + opts.block_size - 1) / opts.block_size);
  const int64_t n_blocks = static_cast<int64_t>(kv->max_blocks_) * opts.n_seqs;
  const int64_t row = hp.head_dim * hp.n_head_kv;
  const int64_t n_slots = n_blocks * opts.block_size;
  const size_t elem = quant::find_traits(opts.type)->type_size;
  const size_t per_tensor = static_cast<size_t>(row * n_slots) * elem;
  KITE_ASSIGN_OR_RETURN(kv->buffer_, backend.alloc(per_tensor * 2 * static_cast<size_t>(hp.n_layer)));
  kv->storage_.resize(static_cast<size_t>(2 * hp.n_layer));
  auto* base = static_cast<uint8_t*>(kv->buffer_->base());
  for (size_t i = 0; i < kv->storage_.size(); ++i) {
    Tensor& t = kv->storage_[i];
    t.type = opts.type;
    t.ne = {row, n_slots, 1, 1};
    t.nb = contiguous_strides(t.type, t.ne);
    t.data = base + i * per_tensor;
    t.buffer = kv->buffer_.get();
    t.name = (i % 2 == 0 ? "cache_k." : "cache_v.") + std::to_string(i / 2);
    (i % 2 == 0 ? kv->tensors_.k : kv->tensors_.v).push_back(&t);
  }
  kv->tensors_.block_size = opts.block_size;
  kv->free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) kv->free_.push_back(static_cast<int32_t>(b));
  kv->seqs_.resize(static_cast<size_t>(opts.n_seqs));
  return kv;
}

Status KvCache::reserve(int32_t seq, int64_t n) {
  Seq& s = seqs_[static_cast<size_t>(seq)];
  const int64_t need_len = s.len + n;
  if (need_len > opts_.n_ctx)
    return make_error("context full: sequence ", seq, " needs ", need_len, " positions, the context holds ", opts_.n_ctx);
  const size_t need_blocks = static_cast<size_t>((need_len + opts_.block_size - 1) / opts_.block_size);
  if (need_blocks > s.blocks.size() && need_blocks - s.blocks.size() > free_.size())
    return make_error("KV cache full: ", need_blocks - s.blocks.size(), " blocks needed, ", free_.size(), " free");
  while (s.blocks.size() < need_blocks) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  return ok_status();
}

void KvCache::truncate(int32_t seq, int64_t len) {
  Seq& s = seqs_[static_cast<size_t>(seq)];
  if (len < s.len) s.len = len;
  const size_t keep = static_cast<size_t>((s.len + opts_.block_size - 1) / opts_.block_size);
  while (s.blocks.size() > keep) {
    free_.push_back(s.blocks.back());
    s.blocks.pop_back();
  }
}

int32_t KvCache::slot(int32_t seq, int64_t pos) const {
  const Seq& s = seqs_[static_cast<size_t>(seq)];
  return s.blocks[static_cast<size_t>(pos / opts_.block_size)] * opts_.block_size +
         static_cast<int32_t>(pos % opts_.block_size);
}

void KvCache::fill_block_table(int32_t* out) const {
  std::memset(out, 0, sizeof(int32_t) * static_cast<size_t>(max_blocks_) * seqs_.size());
  for (size_t s = 0; s < seqs_.size(); ++s)
    for (size_t b = 0; b < seqs_[s].blocks.size(); ++b) out[s * static_cast<size_t>(max_blocks_) + b] = seqs_[s].blocks[b];
}

}  // namespace kite
