// SentencePiece-style BPE by scores.
#include "src/runtime/tokenizer/spm.h"

#include <algorithm>
#include <queue>

#include "src/runtime/tokenizer/unicode.h"
#include "src/runtime/tokenizer/word_cache.h"

namespace kite::tokenizer {

namespace {

struct Sym {
  int32_t prev, next;
  uint32_t start, len;
};

struct Bigram {
  float score;
  int32_t left, right;
  uint32_t len;
  bool operator<(const Bigram& o) const {  // max-heap: higher score, then leftmost
    return score != o.score ? score < o.score : left > o.left;
  }
};

class SpmSession {
 public:
  SpmSession(std::string_view text, const Vocab& vocab) : text_(text), vocab_(vocab) {}

  void run(std::vector<TokenId>& out) {
    for (size_t off = 0; off < text_.size();) {
      const size_t len = std::min(utf8_len(static_cast<uint8_t>(text_[off])), text_.size() - off);
      const int32_t idx = static_cast<int32_t>(syms_.size());
      syms_.push_back(
          {idx - 1, off + len < text_.size() ? idx + 1 : -1, static_cast<uint32_t>(off), static_cast<uint32_t>(len)});
      off += len;
    }
    for (int32_t i = 1; i < static_cast<int32_t>(syms_.size()); ++i) try_add(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Sym& l = syms_[b.left];
      Sym& r = syms_[b.right];
      if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) syms_[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int32_t i = syms_.empty() ? -1 : 0; i != -1; i = syms_[i].next) resegment(syms_[i], out);
  }

 private:
  std::string_view text_of(const Sym& s) const { return text_.substr(s.start, s.len); }

  void try_add(int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    std::string_view t = text_.substr(syms_[left].start, syms_[left].len + syms_[right].len);
    TokenId id = vocab_.find(t);
    if (id == kNoToken) return;
    queue_.push({vocab_.tokens[id].score, left, right, static_cast<uint32_t>(t.size())});
  }

  // Every merged symbol is a token (pairs are queued only when they are); what is left is a
  // single character outside the vocabulary, which becomes byte tokens (or <unk>).
  void resegment(const Sym& s, std::vector<TokenId>& out) {
    std::string_view t = text_of(s);
    TokenId id = vocab_.find(t);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
    for (char c : t) {
      TokenId b = vocab_.byte_token(static_cast<uint8_t>(c));
      if (b == kNoToken) b = vocab_.unk;
      if (b != kNoToken) out.push_back(b);
    }
  }

  std::string_view text_;
  const Vocab& vocab_;
  std::vector<Sym> syms_;
  std::priority_queue<Bigram> queue_;
};

constexpr std::string_view kMark = "\xE2\x96\x81";  // U+2581

}  // namespace

bool spm_splits_at_words(const Vocab& vocab) {
  for (const TokenData& t : vocab.tokens) {
    for (size_t p = t.text.find(kMark, 1); p != std::string::npos; p = t.text.find(kMark, p + 1)) {
      if (p < kMark.size() || t.text.compare(p - kMark.size(), kMark.size(), kMark) != 0) return false;
    }
  }
  return true;
}

void spm_encode(std::string_view text, const Vocab& vocab, std::vector<TokenId>& out) {
  if (text.empty()) return;
  if (!vocab.spm_word_split) {
    SpmSession(text, vocab).run(out);
    return;
  }
  // No token holds U+2581 after another character, so no merge crosses the start of a word:
  // each word is encoded alone (and only once per distinct word). Walking characters exactly
  // as SpmSession does keeps the symbols identical.
  WordCache cache;
  std::vector<TokenId> word;
  auto encode_word = [&](std::string_view w) {
    const uint64_t h = WordCache::hash(w);
    uint32_t off = 0, cnt = 0;
    if (cache.find(w, h, &off, &cnt)) {
      out.insert(out.end(), cache.ids().begin() + off, cache.ids().begin() + off + cnt);
      return;
    }
    word.clear();
    SpmSession(w, vocab).run(word);
    out.insert(out.end(), word.begin(), word.end());
    if (w.size() <= 256) cache.insert(w, h, word);
  };
  size_t start = 0;
  bool prev_mark = false;
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_len(static_cast<uint8_t>(text[off])), text.size() - off);
    const bool mark = text.compare(off, len, kMark) == 0;
    if (mark && !prev_mark && off > start) {
      encode_word(text.substr(start, off - start));
      start = off;
    }
    prev_mark = mark;
    off += len;
  }
  encode_word(text.substr(start));
}

}  // namespace kite::tokenizer
