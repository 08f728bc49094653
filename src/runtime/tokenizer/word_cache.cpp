// Open-addressing cache of encoded pieces, keyed by the bytes of the piece.
#include "src/runtime/tokenizer/word_cache.h"

#include <algorithm>
#include <cstring>

namespace kite::tokenizer {

uint64_t WordCache::hash(std::string_view w) {
  // 8 bytes at a time, multiply-xorshift mixing (the keys are short words).
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (w.size() * 0xC2B2AE3D27D4EB4Full);
  size_t i = 0;
  for (; i + 8 <= w.size(); i += 8) {
    uint64_t x;
    std::memcpy(&x, w.data() + i, 8);
    h = (h ^ x) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t x = 0;
  std::memcpy(&x, w.data() + i, w.size() - i);
  h = (h ^ x) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}

bool WordCache::find(std::string_view w, uint64_t h, uint32_t* off, uint32_t* cnt) const {
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.p == nullptr) return false;
    if (s.hash == h && s.len == w.size() && std::equal(w.begin(), w.end(), s.p)) {
      *off = s.off;
      *cnt = s.cnt;
      return true;
    }
  }
}

void WordCache::insert(std::string_view w, uint64_t h, const std::vector<TokenId>& word) {
  if ((used_ + 1) * 2 > slots_.size()) grow(slots_.size() * 2);
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  while (slots_[i].p != nullptr) i = (i + 1) & mask;
  slots_[i] = Slot{w.data(), static_cast<uint32_t>(w.size()), static_cast<uint32_t>(ids_.size()),
                   static_cast<uint32_t>(word.size()), h};
  ids_.insert(ids_.end(), word.begin(), word.end());
  ++used_;
}

void WordCache::grow(size_t cap) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  for (const Slot& s : old) {
    if (s.p == nullptr) continue;
    size_t i = s.hash & (cap - 1);
    while (slots_[i].p != nullptr) i = (i + 1) & (cap - 1);
    slots_[i] = s;
  }
}

}  // namespace kite::tokenizer
