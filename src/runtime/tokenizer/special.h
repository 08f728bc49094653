// kite/src/runtime/tokenizer/special.h — finding special and added tokens in raw text.
//
// Control (type 3), user-defined (4) and unknown (2) tokens written literally in the text are
// cut out before the model's tokenizer sees it, leftmost-longest (as Hugging Face's added-token
// matcher). User-defined tokens are always matched; control and unknown only with
// parse_special.
#pragma once

#include <array>
#include <string_view>
#include <vector>

#include "src/runtime/tokenizer/vocab.h"

namespace kite::tokenizer {

struct Fragment {
  TokenId token;  // a matched special token, or kNoToken for raw text
  size_t offset;  // raw text: its bytes in the input
  size_t length;
};

class SpecialMatcher {
 public:
  void build(const Vocab& vocab);
  // Splits `text` into raw-text fragments and matched tokens, in order.
  void partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

 private:
  struct Node {
    TokenId token = kNoToken;
    bool always = false;                            // user-defined: matched without parse_special
    std::vector<std::pair<uint8_t, int32_t>> kids;  // sorted by byte
  };
  int32_t child(int32_t node, uint8_t b) const;

  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

}  // namespace kite::tokenizer
