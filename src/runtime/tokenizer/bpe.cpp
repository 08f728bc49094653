// Byte-level BPE: the merge table and the per-word merge loop.
#include "src/runtime/tokenizer/bpe.h"

#include <algorithm>
#include <cstring>

#include "src/runtime/tokenizer/unicode.h"

namespace kite::tokenizer {

Result<BpeModel> BpeModel::build(const gguf::Metadata& md, const Vocab& vocab) {
  const gguf::Value* mv = md.find("tokenizer.ggml.merges");
  if (mv == nullptr) return make_error(md.source(), ": missing key 'tokenizer.ggml.merges'");
  const gguf::Array* merges = mv->get_if<gguf::Array>();
  if (merges == nullptr || merges->elem_type != gguf::ValueType::STRING)
    return make_error(md.source(), ": key 'tokenizer.ggml.merges' is not an array of strings");

  BpeModel m;
  m.n_vocab_ = static_cast<int32_t>(vocab.tokens.size());
  std::unordered_map<std::string, int32_t> extra;  // texts outside the vocabulary
  auto sym = [&](std::string_view text) -> int32_t {
    TokenId id = vocab.find(text);
    if (id != kNoToken) return id;
    auto [it, added] = extra.emplace(std::string(text), m.n_vocab_ + static_cast<int32_t>(extra.size()));
    return it->second;
  };
  const ByteLevelAlphabet& abc = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) m.byte_sym_[b] = sym(abc.encode(static_cast<uint8_t>(b)));

  const size_t n = merges->items.size();
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  m.table_.assign(cap, Entry{kEmpty, 0, 0});
  m.mask_ = cap - 1;
  m.shift_ = 64 - __builtin_ctzll(cap);
  std::string joined;
  for (size_t r = 0; r < n; ++r) {
    const std::string* s = merges->items[r].get_if<std::string>();
    if (s == nullptr) return make_error(md.source(), ": tokenizer.ggml.merges[", r, "] is not a string");
    const size_t sp = s->find(' ', 1);
    if (sp == std::string::npos)
      return make_error(md.source(), ": tokenizer.ggml.merges[", r, "] = '", *s, "' has no space");
    std::string_view a(s->data(), sp), b(s->data() + sp + 1, s->size() - sp - 1);
    joined.assign(a);
    joined.append(b);
    const int32_t ia = sym(a), ib = sym(b), ir = sym(joined);
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia)) << 32) | static_cast<uint32_t>(ib);
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> m.shift_;
    while (m.table_[i].key != kEmpty && m.table_[i].key != key) i = (i + 1) & m.mask_;
    if (m.table_[i].key == key) continue;  // a repeated merge keeps its first (best) rank
    m.table_[i] = Entry{key, static_cast<int32_t>(r), ir};
  }
  m.n_merges_ = n;
  return m;
}

void BpeModel::encode_word(std::string_view word, const Vocab& vocab, std::vector<TokenId>& out, Scratch& s) const {
  if (word.empty()) return;
  if (vocab.ignore_merges) {
    const ByteLevelAlphabet& abc = byte_level_alphabet();
    s.encoded.clear();
    for (char c : word) s.encoded.append(abc.encode(static_cast<uint8_t>(c)));
    TokenId id = vocab.find(s.encoded);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
  }
  auto& syms = s.syms;
  auto& heap = s.heap;
  syms.clear();
  heap.clear();
  const int32_t n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n; ++i) {
    syms.push_back(
        {byte_sym_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, static_cast<uint32_t>(i), 1});
  }
  auto try_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = syms[left].next;
    if (right < 0) return;
    const Entry* e = find(syms[left].id, syms[right].id);
    if (e == nullptr) return;
    heap.push_back({e->rank, left, syms[left].id, syms[right].id});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 0; i + 1 < n; ++i) try_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Scratch::Cand c = heap.back();
    heap.pop_back();
    Scratch::Sym& l = syms[c.left];
    if (l.len == 0 || l.id != c.left_id || l.next < 0) continue;
    Scratch::Sym& r = syms[l.next];
    if (r.id != c.right_id) continue;  // stale: one side changed since the pair was queued
    l.id = find(l.id, r.id)->result;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    try_pair(l.prev);
    try_pair(c.left);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const Scratch::Sym& x = syms[i];
    if (x.id < n_vocab_) {
      out.push_back(x.id);
      continue;
    }
    for (uint32_t k = 0; k < x.len; ++k) {  // a merge result outside the vocabulary: bytes
      TokenId b = vocab.byte_token(static_cast<uint8_t>(word[x.start + k]));
      if (b != kNoToken) out.push_back(b);
    }
  }
}

void BpeSession::encode(std::string_view text, std::vector<TokenId>& out) {
  out_ = &out;
  pre_.for_each_piece(
      text, [](void* self, std::string_view w) { static_cast<BpeSession*>(self)->encode_piece(w); }, this);
}

void BpeSession::encode_piece(std::string_view w) {
  std::vector<TokenId>& out = *out_;
  {
    const uint64_t h = WordCache::hash(w);
    uint32_t off = 0, cnt = 0;
    if (cache_.find(w, h, &off, &cnt)) {
      const TokenId* ids = cache_.ids().data() + off;
      for (uint32_t k = 0; k < cnt; ++k) out.push_back(ids[k]);
      return;
    }
    word_.clear();
    model_.encode_word(w, vocab_, word_, scratch_);
    out.insert(out.end(), word_.begin(), word_.end());
    if (w.size() <= 256) cache_.insert(w, h, word_);  // long runs (whitespace, symbols) are rare
  }
}

}  // namespace kite::tokenizer
