// kite/src/kv/block_pool.h — the bookkeeping of the paged KV cache's physical blocks: reference
// counts, the free list and the prefix cache. It owns no KV bytes (KvCache does); a block here is
// an index.
//
// Invariants:
//  - Every block is in exactly one state: referenced (refcount > 0), cached (refcount 0, holds a
//    registered full block, in the LRU list, reusable by a prefix match until evicted), or free.
//  - allocate / retain / release / lookup are O(1) (expected, for the hash lookup).
//  - A registered block's key is hash(parent key, its tokens, the cache's identity); its tokens
//    and parent key are stored too, so a hash collision can never hand out the wrong block.
//  - allocate() takes a free block first, else evicts the least recently used cached block.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace kite {

class BlockPool {
 public:
  BlockPool(int32_t n_blocks, int32_t block_size);

  int32_t n_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t block_size() const { return block_size_; }
  // Blocks allocate() can hand out now: free plus cached-but-unreferenced.
  int32_t available() const { return static_cast<int32_t>(free_.size()) + n_cached_; }
  int32_t n_referenced() const { return n_blocks() - available(); }
  int32_t n_cached() const { return n_cached_; }

  // A block with refcount 1, or -1 when every block is referenced.
  int32_t allocate();
  void retain(int32_t block);
  void release(int32_t block);
  int32_t refcount(int32_t block) const { return ref_[static_cast<size_t>(block)]; }

  // The prefix cache. key_of() chains a block's key from its parent's (0 for the first block).
  static uint64_t key_of(uint64_t parent, std::span<const int32_t> tokens, uint64_t identity);
  // The cached block holding exactly `tokens` after `parent`, or -1. Does not retain it.
  int32_t lookup(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const;
  // Registers a full, referenced block under `key` (no-op when the key is already cached).
  void publish(int32_t block, uint64_t key, uint64_t parent, std::span<const int32_t> tokens);
  // Removes a block's registration (before it is written again).
  void unpublish(int32_t block);
  bool published(int32_t block) const { return meta_[static_cast<size_t>(block)].published; }

 private:
  struct Meta {
    uint64_t key = 0, parent = 0;
    int32_t lru_prev = -1, lru_next = -1;
    bool published = false;
    bool in_lru = false;
  };
  void lru_unlink(int32_t b);
  void lru_push_back(int32_t b);

  int32_t block_size_;
  std::vector<int32_t> ref_;
  std::vector<Meta> meta_;
  std::vector<int32_t> tokens_;  // block_size tokens per block (valid while published)
  std::vector<int32_t> free_;
  std::unordered_map<uint64_t, int32_t> by_key_;
  int32_t lru_head_ = -1, lru_tail_ = -1, n_cached_ = 0;
};

}  // namespace kite
