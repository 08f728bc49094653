#include "src/kv/block_pool.h"

#include <algorithm>
#include <cstring>

namespace kite {

BlockPool::BlockPool(int32_t n_blocks, int32_t block_size)
    : block_size_(block_size),
      ref_(static_cast<size_t>(n_blocks), 0),
      meta_(static_cast<size_t>(n_blocks)),
      tokens_(static_cast<size_t>(n_blocks) * static_cast<size_t>(block_size), 0) {
  free_.reserve(static_cast<size_t>(n_blocks));
  // Lowest ids first out: allocation order is deterministic and easy to read in a dump.
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
  by_key_.reserve(static_cast<size_t>(n_blocks));
}

int32_t BlockPool::allocate() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (lru_head_ >= 0) {
    b = lru_head_;  // evict the least recently used cached block
    lru_unlink(b);
    unpublish(b);
  } else {
    return -1;
  }
  ref_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockPool::retain(int32_t b) {
  if (ref_[static_cast<size_t>(b)]++ == 0 && meta_[static_cast<size_t>(b)].in_lru) lru_unlink(b);
}

void BlockPool::release(int32_t b) {
  if (--ref_[static_cast<size_t>(b)] > 0) return;
  if (meta_[static_cast<size_t>(b)].published) {
    lru_push_back(b);
  } else {
    free_.push_back(b);
  }
}

uint64_t BlockPool::key_of(uint64_t parent, std::span<const int32_t> tokens, uint64_t identity) {
  // FNV-1a over the parent key, the identity and the token ids, then a 64-bit finalizer (splitmix)
  // so nearby inputs spread over the whole key space. Collisions are caught by lookup().
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  };
  mix(parent);
  mix(identity);
  for (int32_t t : tokens) mix(static_cast<uint32_t>(t));
  h ^= h >> 30, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 27, h *= 0x94d049bb133111ebull, h ^= h >> 31;
  return h == 0 ? 1 : h;
}

int32_t BlockPool::lookup(uint64_t key, uint64_t parent, std::span<const int32_t> tokens) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  const int32_t b = it->second;
  const Meta& m = meta_[static_cast<size_t>(b)];
  if (m.parent != parent || tokens.size() != static_cast<size_t>(block_size_) ||
      !std::equal(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<ptrdiff_t>(b) * block_size_))
    return -1;
  return b;
}

void BlockPool::publish(int32_t b, uint64_t key, uint64_t parent, std::span<const int32_t> tokens) {
  Meta& m = meta_[static_cast<size_t>(b)];
  if (m.published || tokens.size() != static_cast<size_t>(block_size_) || by_key_.count(key) != 0) return;
  by_key_.emplace(key, b);
  m.key = key, m.parent = parent, m.published = true;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<ptrdiff_t>(b) * block_size_);
}

void BlockPool::unpublish(int32_t b) {
  Meta& m = meta_[static_cast<size_t>(b)];
  if (!m.published) return;
  by_key_.erase(m.key);
  m.published = false;
  if (m.in_lru) {  // an unreferenced block that is no longer cached is simply free
    lru_unlink(b);
    free_.push_back(b);
  }
}

void BlockPool::lru_unlink(int32_t b) {
  Meta& m = meta_[static_cast<size_t>(b)];
  (m.lru_prev >= 0 ? meta_[static_cast<size_t>(m.lru_prev)].lru_next : lru_head_) = m.lru_next;
  (m.lru_next >= 0 ? meta_[static_cast<size_t>(m.lru_next)].lru_prev : lru_tail_) = m.lru_prev;
  m.lru_prev = m.lru_next = -1;
  m.in_lru = false;
  --n_cached_;
}

void BlockPool::lru_push_back(int32_t b) {
  Meta& m = meta_[static_cast<size_t>(b)];
  m.lru_prev = lru_tail_;
  m.lru_next = -1;
  (lru_tail_ >= 0 ? meta_[static_cast<size_t>(lru_tail_)].lru_next : lru_head_) = b;
  lru_tail_ = b;
  m.in_lru = true;
  ++n_cached_;
}

}  // namespace kite
