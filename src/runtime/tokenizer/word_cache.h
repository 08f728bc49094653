// kite/src/runtime/tokenizer/word_cache.h — ids of pieces already encoded in one encode() call.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "src/runtime/tokenizer.h"

namespace kite::tokenizer {

// Pieces already encoded in one session: open addressing on a 64-bit hash of the bytes.
class WordCache {
 public:
  WordCache() { grow(1024); }
  // The cached ids of `w` as (offset, count) into ids(), or false.
  bool find(std::string_view w, uint64_t h, uint32_t* off, uint32_t* cnt) const;
  void insert(std::string_view w, uint64_t h, const std::vector<TokenId>& word);
  const std::vector<TokenId>& ids() const { return ids_; }
  static uint64_t hash(std::string_view w);

 private:
  struct Slot {
    const char* p = nullptr;  // nullptr: empty
    uint32_t len = 0, off = 0, cnt = 0;
    uint64_t hash = 0;
  };
  void grow(size_t cap);
  std::vector<Slot> slots_;
  size_t used_ = 0;
  std::vector<TokenId> ids_;
};

}  // namespace kite::tokenizer
