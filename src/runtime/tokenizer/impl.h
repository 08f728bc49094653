// kite/src/runtime/tokenizer/impl.h — the Tokenizer's state: vocabulary plus the model-specific
// parts (special-token matcher, pre-tokenizer and merges for BPE).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/runtime/tokenizer.h"
#include "src/runtime/tokenizer/bpe.h"
#include "src/runtime/tokenizer/pretokenizer.h"
#include "src/runtime/tokenizer/special.h"
#include "src/runtime/tokenizer/vocab.h"

namespace kite::tokenizer {

class Impl {
 public:
  static Result<std::unique_ptr<Impl>> load(const gguf::Metadata& md);

  void encode(std::string_view text, const EncodeOptions& opt, std::vector<TokenId>& out) const;
  // The bytes token `id` adds to decoded text (empty for control tokens when !render_special).
  std::string_view piece(TokenId id, bool render_special) const;
  // Whether decoding drops one leading space of the first piece (SPM space prefix, WPM).
  bool strips_leading_space() const {
    return vocab_.type == VocabType::kWpm || (vocab_.type == VocabType::kSpm && vocab_.add_space_prefix);
  }

  const Vocab& vocab() const { return vocab_; }
  const BpeModel* bpe() const { return bpe_ ? &*bpe_ : nullptr; }
  const PreTokenizer* pre() const { return pre_ ? &*pre_ : nullptr; }

 private:
  Vocab vocab_;
  SpecialMatcher specials_;
  std::optional<PreTokenizer> pre_;
  std::optional<BpeModel> bpe_;
};

}  // namespace kite::tokenizer
