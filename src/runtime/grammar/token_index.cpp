// kite/src/runtime/grammar/token_index.cpp — the byte trie of a vocabulary.
//
// Text tokens are sorted by their bytes; in that order the trie's preorder is the order in which
// nodes are first needed, so the trie is built in one pass (each token adds the nodes past its
// longest common prefix with the previous one) and stored as flat arrays a mask pass scans
// front to back, skipping a whole subtree with node_next() when its prefix is rejected.
#include <algorithm>
#include <numeric>

#include "src/runtime/grammar/grammar.h"
#include "src/runtime/grammar/utf8_step.h"

namespace kite {

std::shared_ptr<const TokenIndex> TokenIndex::build(const Tokenizer& tokenizer) {
  auto idx = std::make_shared<TokenIndex>();
  const int32_t n = tokenizer.n_vocab();
  idx->n_vocab_ = n;
  idx->kind_.assign(static_cast<size_t>(n), kExcluded);
  idx->text_off_.reserve(static_cast<size_t>(n) + 1);
  idx->text_off_.push_back(0);
  for (TokenId id = 0; id < n; ++id) {
    const std::string b = tokenizer.token_bytes(id);
    if (tokenizer.is_eog(id)) {
      idx->kind_[id] = kEog;
      idx->eog_.push_back(id);
    } else if (!tokenizer.is_control(id) && !b.empty() && b.size() <= 0xffff) {
      idx->kind_[id] = kText;
      idx->text_ += b;
    }
    idx->text_off_.push_back(idx->text_.size());
  }

  std::vector<TokenId> order;
  for (TokenId id = 0; id < n; ++id)
    if (idx->kind_[id] == kText) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    const auto x = idx->bytes(a), y = idx->bytes(b);
    return x != y ? x < y : a < b;
  });

  idx->byte_.push_back(0);
  idx->sub_flags_.push_back(kAllValid | kFreshStart);
  idx->depth_.push_back(0);
  idx->tok_begin_.push_back(0);
  std::vector<uint32_t> path{0};                               // path[d]: node at depth d on the current branch
  std::vector<grammar::Utf8State> utf8{grammar::Utf8State{}};  // decoder state after path[d]
  std::vector<char> valid{1};                                  // path[0..d] is valid UTF-8
  std::vector<uint32_t> parent{0};
  std::string_view prev;
  for (TokenId id : order) {
    const std::string_view b = idx->bytes(id);
    size_t common = 0;
    while (common < prev.size() && common < b.size() && prev[common] == b[common]) ++common;
    path.resize(common + 1);
    utf8.resize(common + 1);
    valid.resize(common + 1);
    for (size_t d = common; d < b.size(); ++d) {
      grammar::Utf8State u = utf8[d];
      const bool fresh = valid[d] && u.left == 0;
      const bool ok = valid[d] && grammar::utf8_step(u, static_cast<uint8_t>(b[d])) != grammar::Utf8Step::kInvalid;
      utf8.push_back(u);
      valid.push_back(ok);
      idx->sub_flags_.push_back(static_cast<uint8_t>((ok ? kAllValid : 0) | (fresh ? kFreshStart : 0)));
      parent.push_back(path[d]);
      path.push_back(static_cast<uint32_t>(idx->byte_.size()));
      idx->byte_.push_back(static_cast<uint8_t>(b[d]));
      idx->depth_.push_back(static_cast<uint32_t>(d + 1));
      idx->tok_begin_.push_back(static_cast<uint32_t>(idx->tokens_.size()));
    }
    idx->tokens_.push_back(id);  // belongs to the last node created (b's node)
    idx->max_depth_ = std::max<uint32_t>(idx->max_depth_, static_cast<uint32_t>(b.size()));
    prev = b;
  }
  const size_t nodes = idx->byte_.size();
  idx->tok_begin_.push_back(static_cast<uint32_t>(idx->tokens_.size()));
  // next_[i]: the first node after i's subtree = the next node not deeper than i.
  idx->next_.assign(nodes, static_cast<uint32_t>(nodes));
  std::vector<uint32_t> open;
  for (uint32_t i = 0; i < nodes; ++i) {
    while (!open.empty() && idx->depth_[open.back()] >= idx->depth_[i]) {
      idx->next_[open.back()] = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  // Subtree summaries, children folded into parents (children come after parents in preorder).
  idx->sub_ascii_.assign(2 * nodes, 0);
  idx->sub_height_.assign(nodes, 1);
  for (size_t i = nodes; i-- > 1;) {
    const uint8_t b = idx->byte_[i];
    if (b < 0x80) {
      idx->sub_ascii_[2 * i + (b >> 6)] |= uint64_t{1} << (b & 63);
    } else {
      idx->sub_flags_[i] |= kHasWide;
    }
    const uint32_t p = parent[i];
    idx->sub_height_[p] = std::max(idx->sub_height_[p], idx->sub_height_[i] + 1);
    idx->sub_ascii_[2 * p] |= idx->sub_ascii_[2 * i];
    idx->sub_ascii_[2 * p + 1] |= idx->sub_ascii_[2 * i + 1];
    idx->sub_flags_[p] |= idx->sub_flags_[i] & kHasWide;
    if (!(idx->sub_flags_[i] & kAllValid)) idx->sub_flags_[p] &= static_cast<uint8_t>(~kAllValid);
  }
  return idx;
}

}  // namespace kite
