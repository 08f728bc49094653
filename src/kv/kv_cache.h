// kite/src/kv/kv_cache.h — the KV cache in fixed-size blocks with a block table per sequence.
//
// Invariants:
//  - Storage is one buffer per cache: per layer a K and a V tensor [head_dim * n_head_kv, n_slots],
//    n_slots = n_blocks * block_size; slot = block * block_size + offset.
//  - A sequence's positions 0..len-1 live in the blocks of its table, in order; attention reads
//    them through the table, never gathered into a contiguous copy.
//  - Blocks are allocated and freed in O(1) from a free list; a block belongs to one sequence.
// (Refcounted sharing, the prefix cache and copy-on-write come with the paged-KV issue.)
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "src/core/backend.h"
#include "src/model/hparams.h"
#include "src/model/model.h"

namespace kite {

struct KvCacheOptions {
  int64_t n_ctx = 2048;      // positions per sequence at most
  int32_t n_seqs = 1;        // sequences at most
  int32_t block_size = 16;
  DType type = DType::F16;   // F16 (default), F32 or BF16
};

class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(const HParams& hp, const KvCacheOptions& opts, Backend& backend);

  int32_t block_size() const { return opts_.block_size; }
  int32_t max_blocks_per_seq() const { return max_blocks_; }
  int32_t n_seqs() const { return opts_.n_seqs; }
  int64_t n_ctx() const { return opts_.n_ctx; }
  int64_t seq_len(int32_t seq) const { return seqs_[static_cast<size_t>(seq)].len; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }

  // Makes room for `n` more positions of `seq`; an error (nothing changed) when it cannot.
  Status reserve(int32_t seq, int64_t n);
  // Marks `n` positions as written (after a successful step).
  void advance(int32_t seq, int64_t n) { seqs_[static_cast<size_t>(seq)].len += n; }
  // Drops positions >= len of `seq`, freeing whole blocks past it.
  void truncate(int32_t seq, int64_t len);
  void clear(int32_t seq) { truncate(seq, 0); }

  int32_t slot(int32_t seq, int64_t pos) const;
  // Writes the block table [max_blocks_per_seq, n_seqs] as I32 (unused entries 0).
  void fill_block_table(int32_t* out) const;

  const KvTensors& tensors() const { return tensors_; }

 private:
  struct Seq {
    std::vector<int32_t> blocks;
    int64_t len = 0;
  };
  KvCacheOptions opts_;
  int32_t max_blocks_ = 0;
  std::unique_ptr<Buffer> buffer_;
  std::vector<Tensor> storage_;  // the K/V tensors (2 per layer)
  KvTensors tensors_;
  std::vector<int32_t> free_;
  std::vector<Seq> seqs_;
};

}  // namespace kite
