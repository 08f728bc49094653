#include "src/kv/kv_cache.h"

#include <algorithm>
#include <climits>
#include <cstring>

namespace kite {

size_t KvCache::block_bytes(const HParams& hp, DType type, int32_t block_size) {
  const quant::TypeTraits* tt = quant::find_traits(type);
  const size_t row = static_cast<size_t>(hp.head_dim * hp.n_head_kv) / static_cast<size_t>(tt->block_size) * tt->type_size;
  return 2 * static_cast<size_t>(hp.n_layer) * row * static_cast<size_t>(block_size);
}

size_t KvCache::layer_bytes(const HParams& hp, DType type, int32_t block_size, int64_t n_blocks) {
  return block_bytes(hp, type, block_size) / static_cast<size_t>(std::max<int64_t>(hp.n_layer, 1)) *
         static_cast<size_t>(n_blocks);
}

Result<std::unique_ptr<KvCache>> KvCache::create(const HParams& hp, const KvCacheOptions& opts, Backend& backend) {
  std::vector<Backend*> per_layer(static_cast<size_t>(std::max<int64_t>(hp.n_layer, 0)), &backend);
  return create(hp, opts, per_layer);
}

Result<std::unique_ptr<KvCache>> KvCache::create(const HParams& hp, const KvCacheOptions& opts,
                                                 std::span<Backend* const> layer_backends) {
  if (opts.type != DType::F16 && opts.type != DType::F32 && opts.type != DType::BF16 && opts.type != DType::Q8_0)
    return make_error("KV cache type must be f16, bf16, f32 or q8_0");
  if (opts.n_ctx <= 0 || opts.n_seqs <= 0 || opts.block_size <= 0 || opts.n_blocks < 0)
    return make_error("KV cache: context, sequences and block size must be positive");
  const size_t n_layer = static_cast<size_t>(hp.n_layer);
  if (n_layer == 0 || layer_backends.empty() || layer_backends.size() % n_layer != 0)
    return make_error("KV cache: ", layer_backends.size(), " layer backends for ", hp.n_layer, " layers");
  const size_t ranks = layer_backends.size() / n_layer;
  const int64_t row = hp.head_dim * hp.n_head_kv;
  const quant::TypeTraits* tt = quant::find_traits(opts.type);
  if (row % tt->block_size != 0 || hp.head_dim % tt->block_size != 0)
    return make_error("KV cache type ", tt->name, " needs head_dim (", hp.head_dim, ") to be a multiple of ", tt->block_size);
  const int32_t max_blocks = static_cast<int32_t>((opts.n_ctx + opts.block_size - 1) / opts.block_size);
  const int64_t n_blocks = opts.n_blocks > 0 ? opts.n_blocks : static_cast<int64_t>(max_blocks) * opts.n_seqs;
  if (n_blocks > INT32_MAX / opts.block_size) return make_error("KV cache: ", n_blocks, " blocks are too many");

  auto kv = std::unique_ptr<KvCache>(new KvCache(opts, static_cast<int32_t>(n_blocks)));
  kv->max_blocks_ = max_blocks;
  const int64_t n_slots = n_blocks * opts.block_size;
  kv->row_bytes_ = static_cast<size_t>(row / tt->block_size) * tt->type_size;
  const size_t per_tensor = kv->row_bytes_ * static_cast<size_t>(n_slots);
  kv->storage_.resize(2 * layer_backends.size());  // (rank, layer, K/V)
  // One buffer per backend, holding its layers' K and V in layer order.
  std::vector<Backend*> owners;
  for (Backend* b : layer_backends)
    if (std::find(owners.begin(), owners.end(), b) == owners.end()) owners.push_back(b);
  for (Backend* owner : owners) {
    const size_t n_tensors = 2 * static_cast<size_t>(std::count(layer_backends.begin(), layer_backends.end(), owner));
    KITE_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, owner->alloc(per_tensor * n_tensors));
    auto* base = static_cast<uint8_t*>(buf->base());
    size_t next = 0;
    for (size_t i = 0; i < kv->storage_.size(); ++i) {
      if (layer_backends[i / 2] != owner) continue;
      Tensor& t = kv->storage_[i];
      t.type = opts.type;
      t.ne = {row, n_slots, 1, 1};
      t.nb = contiguous_strides(t.type, t.ne);
      t.data = base + next++ * per_tensor;
      t.buffer = buf.get();
      t.layer = static_cast<int32_t>(i / 2 % n_layer);
      t.name = (i % 2 == 0 ? "cache_k." : "cache_v.") + std::to_string(t.layer) +
               (ranks > 1 ? ".tp" + std::to_string(i / 2 / n_layer) : "");
    }
    kv->buffers_.push_back(std::move(buf));
  }
  kv->tensors_.resize(ranks);
  for (size_t i = 0; i < kv->storage_.size(); ++i) {
    KvTensors& r = kv->tensors_[i / 2 / n_layer];
    (i % 2 == 0 ? r.k : r.v).push_back(&kv->storage_[i]);
    r.block_size = opts.block_size;
  }
  kv->seqs_.resize(static_cast<size_t>(opts.n_seqs));
  return kv;
}

KvStats KvCache::stats() const {
  KvStats s;
  s.blocks_total = pool_.n_blocks();
  s.blocks_used = pool_.n_referenced();
  s.blocks_cached = pool_.n_cached();
  s.prefix_queried_tokens = prefix_queried_;
  s.prefix_hit_tokens = prefix_hits_;
  s.cow_copies = cow_copies_;
  return s;
}

int32_t KvCache::blocks_needed(int32_t seq, int64_t n) const {
  const Seq& s = seqs_[static_cast<size_t>(seq)];
  const int64_t bs = opts_.block_size;
  const int64_t need = (s.len + n + bs - 1) / bs - static_cast<int64_t>(s.blocks.size());
  // The block holding position len is written: it must be ours alone and unpublished.
  int32_t cow = 0;
  if (n > 0 && s.len % bs != 0) {
    const int32_t last = s.blocks[static_cast<size_t>(s.len / bs)];
    cow = pool_.refcount(last) > 1 ? 1 : 0;
  }
  return static_cast<int32_t>(std::max<int64_t>(need, 0)) + cow;
}

Status KvCache::reserve(int32_t seq, int64_t n) {
  Seq& s = seqs_[static_cast<size_t>(seq)];
  if (s.len + n > opts_.n_ctx)
    return make_error("context full: sequence ", seq, " needs ", s.len + n, " positions, the context holds ", opts_.n_ctx);
  const int32_t need = blocks_needed(seq, n);
  if (need > pool_.available())
    return make_error("KV cache full: ", need, " blocks needed, ", pool_.available(), " available of ", pool_.n_blocks());
  const int64_t bs = opts_.block_size;
  if (n > 0 && s.len % bs != 0) {
    int32_t& last = s.blocks[static_cast<size_t>(s.len / bs)];
    if (pool_.refcount(last) > 1) {
      const int32_t fresh = pool_.allocate();
      KITE_TRY(copy_block(fresh, last));
      pool_.release(last);
      last = fresh;
      ++cow_copies_;
    } else {
      pool_.unpublish(last);  // a truncated, once-full block is about to change
    }
  }
  const size_t want = static_cast<size_t>((s.len + n + bs - 1) / bs);
  while (s.blocks.size() < want) s.blocks.push_back(pool_.allocate());
  return ok_status();
}

Status KvCache::copy_block(int32_t dst, int32_t src) {
  const size_t bytes = row_bytes_ * static_cast<size_t>(opts_.block_size);
  for (const Tensor& t : storage_)
    KITE_TRY(t.buffer->backend().copy(t, static_cast<size_t>(dst) * bytes, t, static_cast<size_t>(src) * bytes, bytes));
  return ok_status();
}

void KvCache::advance(int32_t seq, std::span<const int32_t> tokens) {
  Seq& s = seqs_[static_cast<size_t>(seq)];
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  s.len += static_cast<int64_t>(tokens.size());
  if (!opts_.prefix_cache) return;
  const size_t bs = static_cast<size_t>(opts_.block_size);
  while (s.keys.size() < static_cast<size_t>(s.len) / bs) {
    const size_t b = s.keys.size();
    const uint64_t parent = b == 0 ? 0 : s.keys[b - 1];
    const std::span<const int32_t> toks(s.tokens.data() + b * bs, bs);
    const uint64_t key = BlockPool::key_of(parent, toks, opts_.identity);
    pool_.publish(s.blocks[b], key, parent, toks);
    s.keys.push_back(key);
  }
}

void KvCache::truncate(int32_t seq, int64_t len) {
  Seq& s = seqs_[static_cast<size_t>(seq)];
  if (len < s.len) s.len = std::max<int64_t>(len, 0);
  const size_t bs = static_cast<size_t>(opts_.block_size);
  const size_t keep = (static_cast<size_t>(s.len) + bs - 1) / bs;
  while (s.blocks.size() > keep) {
    pool_.release(s.blocks.back());
    s.blocks.pop_back();
  }
  s.tokens.resize(static_cast<size_t>(s.len));
  s.keys.resize(std::min(s.keys.size(), static_cast<size_t>(s.len) / bs));
}

int64_t KvCache::match_prefix(int32_t seq, std::span<const int32_t> tokens) {
  Seq& s = seqs_[static_cast<size_t>(seq)];
  if (s.len != 0 || !opts_.prefix_cache || tokens.size() < 2) return 0;
  const size_t bs = static_cast<size_t>(opts_.block_size);
  const size_t max_blocks = (tokens.size() - 1) / bs;  // leave one token to compute
  prefix_queried_ += static_cast<int64_t>(tokens.size());
  uint64_t parent = 0;
  for (size_t b = 0; b < max_blocks; ++b) {
    const std::span<const int32_t> toks = tokens.subspan(b * bs, bs);
    const uint64_t key = BlockPool::key_of(parent, toks, opts_.identity);
    const int32_t block = pool_.lookup(key, parent, toks);
    if (block < 0) break;
    pool_.retain(block);
    s.blocks.push_back(block);
    s.keys.push_back(key);
    s.tokens.insert(s.tokens.end(), toks.begin(), toks.end());
    parent = key;
  }
  s.len = static_cast<int64_t>(s.tokens.size());
  prefix_hits_ += s.len;
  return s.len;
}

Status KvCache::fork(int32_t src, int32_t dst) {
  if (src == dst) return make_error("fork: source and destination are both sequence ", src);
  Seq& d = seqs_[static_cast<size_t>(dst)];
  if (d.len != 0 || !d.blocks.empty()) return make_error("fork: destination sequence ", dst, " is not empty");
  const Seq& s = seqs_[static_cast<size_t>(src)];
  for (int32_t b : s.blocks) pool_.retain(b);
  d = s;
  return ok_status();
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

size_t KvCache::seq_state_bytes(int32_t seq) const {
  return storage_.size() * row_bytes_ * static_cast<size_t>(seq_len(seq));
}

Status KvCache::read_seq(int32_t seq, std::span<uint8_t> out) const {
  if (out.size() != seq_state_bytes(seq))
    return make_error("KV state of sequence ", seq, ": buffer has ", out.size(), " bytes, expected ", seq_state_bytes(seq));
  const Seq& s = seqs_[static_cast<size_t>(seq)];
  const int64_t bs = opts_.block_size;
  uint8_t* dst = out.data();
  for (const Tensor& t : storage_) {
    for (int64_t pos = 0; pos < s.len; pos += bs) {  // a block's positions are contiguous rows
      const size_t rows = static_cast<size_t>(std::min<int64_t>(bs, s.len - pos));
      const size_t offset = static_cast<size_t>(slot(seq, pos)) * row_bytes_;
      KITE_TRY(t.buffer->backend().download(t, dst, rows * row_bytes_, offset));
      dst += rows * row_bytes_;
    }
  }
  return ok_status();
}

Status KvCache::write_seq(int32_t seq, std::span<const int32_t> tokens, std::span<const uint8_t> bytes) {
  const Seq& s = seqs_[static_cast<size_t>(seq)];
  if (s.len != 0 || !s.blocks.empty()) return make_error("KV state: sequence ", seq, " is not empty");
  const size_t expected = storage_.size() * row_bytes_ * tokens.size();
  if (bytes.size() != expected)
    return make_error("KV state: ", bytes.size(), " bytes for ", tokens.size(), " tokens, expected ", expected);
  const int64_t n = static_cast<int64_t>(tokens.size());
  KITE_TRY(reserve(seq, n));
  const int64_t bs = opts_.block_size;
  const uint8_t* src = bytes.data();
  for (const Tensor& t : storage_) {
    for (int64_t pos = 0; pos < n; pos += bs) {
      const size_t rows = static_cast<size_t>(std::min<int64_t>(bs, n - pos));
      const size_t offset = static_cast<size_t>(slot(seq, pos)) * row_bytes_;
      if (auto st = t.buffer->backend().upload(t, src, rows * row_bytes_, offset); !st) {
        clear(seq);
        return st;
      }
      src += rows * row_bytes_;
    }
  }
  advance(seq, tokens);
  return ok_status();
}

}  // namespace kite
