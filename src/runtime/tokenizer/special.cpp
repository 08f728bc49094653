// A byte trie of the special/added tokens and leftmost-longest partitioning.
#include "src/runtime/tokenizer/special.h"

#include <algorithm>

namespace kite::tokenizer {

void SpecialMatcher::build(const Vocab& vocab) {
  nodes_.assign(1, Node{});
  first_.fill(false);
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    const TokenData& t = vocab.tokens[id];
    if (t.type != TokenType::kControl && t.type != TokenType::kUserDefined && t.type != TokenType::kUnknown) continue;
    int32_t node = 0;
    for (char ch : t.text) {
      const uint8_t b = static_cast<uint8_t>(ch);
      int32_t next = child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& kids = nodes_[node].kids;
        kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{0})), {b, next});
      }
      node = next;
    }
    if (nodes_[node].token == kNoToken) {  // a duplicate text keeps the first id
      nodes_[node].token = static_cast<TokenId>(id);
      nodes_[node].always = t.type == TokenType::kUserDefined;
    }
    first_[static_cast<uint8_t>(t.text[0])] = true;
  }
}

int32_t SpecialMatcher::child(int32_t node, uint8_t b) const {
  const auto& kids = nodes_[node].kids;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{0}));
  return (it != kids.end() && it->first == b) ? it->second : -1;
}

void SpecialMatcher::partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const {
  out.clear();
  size_t raw_start = 0;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (!first_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    TokenId best = kNoToken;
    size_t best_len = 0;
    int32_t node = 0;
    for (size_t j = i; j < n; ++j) {
      node = child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      const Node& nd = nodes_[node];
      if (nd.token != kNoToken && (parse_special || nd.always)) {
        best = nd.token;
        best_len = j + 1 - i;
      }
    }
    if (best == kNoToken) {
      ++i;
      continue;
    }
    if (i > raw_start) out.push_back({kNoToken, raw_start, i - raw_start});
    out.push_back({best, i, best_len});
    i += best_len;
    raw_start = i;
  }
  if (n > raw_start) out.push_back({kNoToken, raw_start, n - raw_start});
}

}  // namespace kite::tokenizer
