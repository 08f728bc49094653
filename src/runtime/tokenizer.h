// kite/src/runtime/tokenizer.h — text <-> token ids for SPM, byte-level BPE and WPM vocabularies.
//
// A Tokenizer is built from GGUF-convention metadata (tokenizer.ggml.model, .pre, .tokens,
// .scores, .token_type, .merges, the special token ids and add_* flags), so a GGUF file and a
// Hugging Face folder (whose tokenizer.json is translated into the same keys) load the same way:
//
//   KITE_ASSIGN_OR_RETURN(auto src, WeightSource::open(path));
//   KITE_ASSIGN_OR_RETURN(auto tok, Tokenizer::load(src->metadata()));
//   std::vector<TokenId> ids = tok->encode("Hello world", {.add_special = true});
//   std::string text = tok->decode(ids);
//
//   StreamDecoder dec(*tok);                // streaming: feed one token at a time
//   for (TokenId id : generated) std::cout << dec.push(id);
//   std::cout << dec.flush();
//
// Contracts:
//   - One Tokenizer is immutable after load() and may be shared by any number of threads;
//     encode()/decode() keep their scratch state on the stack of the call.
//   - Pre-tokenization (byte-level BPE) runs the Hugging Face regexes through PCRE2 (UTF + UCP,
//     JIT): Unicode categories come from PCRE2's tables, nothing is hand-typed. BERT
//     normalization (lowercase, accent stripping, categories) uses tables generated at build
//     time from Debian's unicode-data (UnicodeData.txt).
//   - decode() and StreamDecoder never return broken UTF-8: bytes that cannot form a character
//     become U+FFFD; StreamDecoder holds back an incomplete character until it completes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf.h"
#include "src/base/status.h"

namespace kite {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

enum class VocabType { kSpm, kBpe, kWpm };

// GGUF tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct EncodeOptions {
  // Adds BOS/EOS (SEP/CLS for WPM) as the model's add_bos_token/add_eos_token say.
  bool add_special = true;
  // Matches control tokens (type 3) written in the text, e.g. "<|eot_id|>". User-defined tokens
  // (type 4) are always matched, as Hugging Face's added tokens are.
  bool parse_special = false;
};

struct DecodeOptions {
  // Writes the text of control/unknown tokens ("<|eot_id|>"); when false they produce nothing.
  bool render_special = true;
  // SPM/WPM: drops the space the encoder put in front of the first word, when the first token
  // decoded is the first token of the text (not for a continuation of a stream).
  bool strip_leading_space = true;
};

namespace tokenizer {
class Impl;
}

class Tokenizer {
 public:
  // Builds the tokenizer from GGUF-convention keys; errors name the key and what is wrong.
  static Result<std::shared_ptr<const Tokenizer>> load(const gguf::Metadata& metadata);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Full decode; always valid UTF-8 (U+FFFD for bytes that do not form characters).
  std::string decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;

  // The bytes a token stands for (may be part of a UTF-8 character, e.g. byte tokens).
  // Control tokens give their text. Empty for ids out of range.
  std::string token_bytes(TokenId id) const;
  // The token's string as stored in the vocabulary ("Ġthe", "▁the", "<0x0A>").
  std::string_view token_text(TokenId id) const;
  std::optional<TokenId> find_token(std::string_view text) const;

  VocabType type() const;
  const std::string& model_name() const;  // tokenizer.ggml.model
  const std::string& pre_name() const;    // tokenizer.ggml.pre (empty if none)
  int32_t n_vocab() const;
  TokenType token_type(TokenId id) const;
  float token_score(TokenId id) const;

  TokenId bos() const;  // kNoToken when the model has none
  TokenId eos() const;
  TokenId eot() const;
  TokenId unk() const;
  TokenId pad() const;
  TokenId sep() const;
  bool add_bos() const;
  bool add_eos() const;
  // End-of-generation: eos, eot and the control tokens named like them (<|im_end|>, <|eot_id|>...).
  bool is_eog(TokenId id) const;
  bool is_control(TokenId id) const;  // control or unknown: not text

  const tokenizer::Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<tokenizer::Impl> impl);
  std::unique_ptr<tokenizer::Impl> impl_;
};

// Streams text out of tokens as they are generated: push() returns the text that became
// complete (whole UTF-8 characters only); flush() returns what is left, with U+FFFD for an
// incomplete character. A decoder follows one sequence; it is cheap, make one per stream.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, DecodeOptions options = {});

  std::string push(TokenId id);
  std::string flush();
  // Starts a new sequence (the next token is again "first" for strip_leading_space).
  void reset();

 private:
  const Tokenizer* tok_;
  DecodeOptions options_;
  std::string pending_;  // bytes of an incomplete UTF-8 character
  bool first_ = true;
};

}  // namespace kite
