// kite/src/kv/kv_cache.h — the paged KV cache: one pool of fixed-size blocks shared by every
// sequence, a block table per sequence, a prefix cache and copy-on-write sharing.
//
// Invariants:
//  - Storage: per layer a K and a V tensor [head_dim * n_head_kv, n_slots], n_slots =
//    n_blocks * block_size; slot = block * block_size + offset. A block's slots are contiguous
//    rows of every layer's K and V. A layer's tensors are in a buffer of that layer's backend
//    (one buffer per backend; layers split across backends keep their KV where they run).
//  - Sequence s's positions 0..len-1 live in the blocks of its table, in order; attention reads
//    them through the table, never gathered into a contiguous copy.
//  - Blocks are refcounted (BlockPool): fork() and prefix matches share them; a shared or cached
//    block is never written — reserve() copies it first (copy-on-write).
//  - Every full block a sequence writes is published in the prefix cache under
//    hash(parent key, its tokens, identity); a later sequence starting with the same tokens reuses
//    it (match_prefix). Unreferenced cached blocks are evicted least-recently-used.
//  - An error from reserve() leaves the sequence as it was (its length and contents).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "src/core/backend.h"
#include "src/kv/block_pool.h"
#include "src/model/hparams.h"
#include "src/model/model.h"

namespace kite {

struct KvCacheOptions {
  int64_t n_ctx = 2048;     // positions per sequence at most
  int32_t n_seqs = 1;       // sequence slots (rows of the block table)
  int32_t block_size = 16;  // positions per block
  int64_t n_blocks = 0;     // pool size; 0: enough for every slot to hold n_ctx positions
  DType type = DType::F16;  // F16 (default), BF16, F32 or Q8_0
  bool prefix_cache = true;
  uint64_t identity = 0;    // mixed into prefix keys: the model (and adapter) the KV belongs to
};

struct KvStats {
  int32_t blocks_total = 0, blocks_used = 0, blocks_cached = 0;
  int64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;
  int64_t cow_copies = 0;
};

class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(const HParams& hp, const KvCacheOptions& opts, Backend& backend);
  // Layer il's K and V on `layer_backends[il]` (n_layer entries). Tensor parallelism: n_layer
  // entries per rank, rank-major, and hp the ranks' (each holds its share of the KV heads).
  static Result<std::unique_ptr<KvCache>> create(const HParams& hp, const KvCacheOptions& opts,
                                                 std::span<Backend* const> layer_backends);
  // Bytes of one layer's K and V for `n_blocks` blocks.
  static size_t layer_bytes(const HParams& hp, DType type, int32_t block_size, int64_t n_blocks);
  // Bytes of one block (K and V of every layer): 2 x layers x kv_heads x head_dim x elem x block.
  static size_t block_bytes(const HParams& hp, DType type, int32_t block_size);

  int32_t block_size() const { return opts_.block_size; }
  int32_t max_blocks_per_seq() const { return max_blocks_; }
  int32_t n_seqs() const { return opts_.n_seqs; }
  int64_t n_ctx() const { return opts_.n_ctx; }
  DType type() const { return opts_.type; }
  int64_t seq_len(int32_t seq) const { return seqs_[static_cast<size_t>(seq)].len; }
  const BlockPool& pool() const { return pool_; }
  KvStats stats() const;

  // Blocks reserve(seq, n) would have to take from the pool (new blocks plus a copy-on-write).
  int32_t blocks_needed(int32_t seq, int64_t n) const;
  // Makes room for `n` more positions of `seq`: allocates blocks and copies a shared last block
  // before it is written. An error (nothing changed) when the context or the pool is full.
  Status reserve(int32_t seq, int64_t n);
  // Records the tokens just written at the end of `seq` (after a successful step) and publishes
  // the blocks they filled in the prefix cache.
  void advance(int32_t seq, std::span<const int32_t> tokens);
  // Drops positions >= len of `seq`, releasing whole blocks past it.
  void truncate(int32_t seq, int64_t len);
  void clear(int32_t seq) { truncate(seq, 0); }

  // An empty `seq` takes the longest run of cached blocks that begin `tokens`, leaving at least
  // one token to compute (its logits are needed). Returns the number of positions reused.
  int64_t match_prefix(int32_t seq, std::span<const int32_t> tokens);
  // An empty `dst` shares all of `src`'s blocks (copy-on-write on the next write of either).
  Status fork(int32_t src, int32_t dst);

  int32_t slot(int32_t seq, int64_t pos) const;
  // Writes the block table [max_blocks_per_seq, n_seqs] as I32 (unused entries 0).
  void fill_block_table(int32_t* out) const;

  // The K/V tensors of rank `rank` (0 without tensor parallelism). Blocks, tables and slots are
  // common to the ranks; copies and sessions cover every rank's tensors.
  const KvTensors& tensors(size_t rank = 0) const { return tensors_[rank]; }
  size_t n_ranks() const { return tensors_.size(); }

  // Saving and restoring a sequence (sessions): its K/V bytes for positions 0..len-1, tensor by
  // tensor (layer 0 K, layer 0 V, layer 1 K, ...), position by position, row_bytes() each.
  size_t row_bytes() const { return row_bytes_; }
  // The tokens positions 0..len-1 of `seq` hold.
  std::span<const int32_t> seq_tokens(int32_t seq) const { return seqs_[static_cast<size_t>(seq)].tokens; }
  size_t seq_state_bytes(int32_t seq) const;
  // Copies the bytes of `seq` into `out` (exactly seq_state_bytes(seq) bytes).
  Status read_seq(int32_t seq, std::span<uint8_t> out) const;
  // Fills the empty `seq` with `tokens` and the bytes read_seq wrote for them (same model and KV
  // type); full blocks are published in the prefix cache as if they had been computed. An error
  // (the context or the pool is full, a size mismatch) leaves `seq` empty.
  Status write_seq(int32_t seq, std::span<const int32_t> tokens, std::span<const uint8_t> bytes);

 private:
  struct Seq {
    std::vector<int32_t> blocks;
    std::vector<int32_t> tokens;  // what positions 0..len-1 hold (for prefix keys)
    std::vector<uint64_t> keys;   // prefix key of each full block
    int64_t len = 0;
  };
  KvCache(const KvCacheOptions& opts, int32_t n_blocks) : opts_(opts), pool_(n_blocks, opts.block_size) {}
  Status copy_block(int32_t dst, int32_t src);

  KvCacheOptions opts_;
  BlockPool pool_;
  int32_t max_blocks_ = 0;
  size_t row_bytes_ = 0;
  std::vector<std::unique_ptr<Buffer>> buffers_;  // one per backend holding layers
  std::vector<Tensor> storage_;  // the K/V tensors (2 per layer and rank); each one's buffer names its backend
  std::vector<KvTensors> tensors_;  // per rank
  std::vector<Seq> seqs_;
  int64_t prefix_queried_ = 0, prefix_hits_ = 0, cow_copies_ = 0;
};

}  // namespace kite
