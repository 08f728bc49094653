// kite/src/runtime/tokenizer/bpe.h — byte-level BPE (GPT-2 family).
//
// Merges work on symbol ids, not strings: every merge "a b" becomes an entry keyed by the pair
// (id(a), id(b)) holding its rank and the id of "ab". A word starts as one symbol per byte and
// repeatedly merges the adjacent pair with the lowest rank (leftmost first on ties), using a
// heap of candidate pairs over a linked list of symbols. Texts that appear in merges but not
// in the vocabulary get ids past the vocabulary so the merge order stays exact.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/runtime/tokenizer/pretokenizer.h"
#include "src/runtime/tokenizer/vocab.h"
#include "src/runtime/tokenizer/word_cache.h"

namespace kite::tokenizer {

class BpeModel {
 public:
  static Result<BpeModel> build(const gguf::Metadata& md, const Vocab& vocab);

  struct Scratch;
  // Appends the tokens of one pre-token given as raw bytes.
  void encode_word(std::string_view word, const Vocab& vocab, std::vector<TokenId>& out, Scratch& s) const;

  size_t n_merges() const { return n_merges_; }

 private:
  struct Entry {
    uint64_t key;
    int32_t rank;
    int32_t result;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  const Entry* find(int32_t a, int32_t b) const {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;
    while (true) {
      const Entry& e = table_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

  int32_t n_vocab_ = 0;
  size_t n_merges_ = 0;
  std::array<int32_t, 256> byte_sym_{};
  std::vector<Entry> table_;
  size_t mask_ = 0;
  int shift_ = 64;
};

struct BpeModel::Scratch {
  struct Sym {
    int32_t id;
    int32_t prev, next;
    uint32_t start, len;  // bytes of the word
  };
  struct Cand {
    int32_t rank;
    int32_t left;  // symbol index
    int32_t left_id, right_id;
    bool operator<(const Cand& o) const {  // max-heap on "better": lower rank, then leftmost
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::vector<Sym> syms;
  std::vector<Cand> heap;
  std::string encoded;
};

// Encodes whole raw-text fragments: pre-tokenizes, then BPE per piece with a cache of pieces
// already seen in this session (one session per encode() call).
class BpeSession {
 public:
  BpeSession(const BpeModel& model, const Vocab& vocab, const PreTokenizer& pre)
      : model_(model), vocab_(vocab), pre_(pre) {}
  // `text` must stay alive as long as the session (the cache keeps views into it).
  void encode(std::string_view text, std::vector<TokenId>& out);

 private:
  const BpeModel& model_;
  const Vocab& vocab_;
  const PreTokenizer& pre_;
  void encode_piece(std::string_view w);

  BpeModel::Scratch scratch_;
  std::vector<TokenId>* out_ = nullptr;
  WordCache cache_;
  std::vector<TokenId> word_;
};

}  // namespace kite::tokenizer
