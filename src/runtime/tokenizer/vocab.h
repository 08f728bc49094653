// kite/src/runtime/tokenizer/vocab.h — the vocabulary as loaded from GGUF-convention metadata.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/gguf.h"
#include "src/runtime/tokenizer.h"

namespace kite::tokenizer {

struct TokenData {
  std::string text;   // as stored: "Ġthe", "▁the", "<0x0A>", "##ing" -> "ing" (GGUF WPM form)
  std::string bytes;  // what the token decodes to
  float score = 0.0f;
  TokenType type = TokenType::kNormal;
};

struct Vocab {
  Vocab() = default;
  Vocab(Vocab&&) = default;  // moves keep the string views in to_id valid (vector buffers move)
  Vocab& operator=(Vocab&&) = default;
  Vocab(const Vocab&) = delete;
  Vocab& operator=(const Vocab&) = delete;

  VocabType type = VocabType::kSpm;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre
  std::vector<TokenData> tokens;
  std::unordered_map<std::string_view, TokenId> to_id;  // views into tokens[i].text
  size_t max_token_len = 0;

  TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken;
  TokenId pad = kNoToken, sep = kNoToken, mask = kNoToken;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = false;  // SPM: a space in front of the text (and after special tokens)
  bool ignore_merges = false;     // BPE: a pre-token that is a whole token is emitted as is
  bool lowercase = true;          // WPM normalizer
  bool spm_word_split = false;    // SPM: words encode independently (see spm_splits_at_words)
  std::vector<bool> eog;          // per token: ends generation

  TokenId find(std::string_view text) const {
    auto it = to_id.find(text);
    return it == to_id.end() ? kNoToken : it->second;
  }
  bool valid(TokenId id) const { return id >= 0 && static_cast<size_t>(id) < tokens.size(); }
  // The token for one byte: "<0xNN>" (SPM), the byte-level character (BPE), or kNoToken.
  TokenId byte_token(uint8_t b) const;
};

// Reads tokenizer.ggml.* keys; errors name the metadata source and the key.
Result<Vocab> load_vocab(const gguf::Metadata& md);

}  // namespace kite::tokenizer
