// kite/src/runtime/tokenizer/pretokenizer.h — regex pre-tokenization for byte-level BPE.
//
// A pre-tokenizer is a sequence of regexes, each applied to every piece the previous ones
// produced, keeping both the matches and the text between them ("Isolated" splitting, as a
// Hugging Face `Sequence` of `Split` pre-tokenizers does). The regexes are the ones in the
// models' tokenizer.json files, run by PCRE2 with UTF + UCP (so \p{L}, \p{N}, \s use PCRE2's
// Unicode tables) and JIT-compiled.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace kite::tokenizer {

class MatchState;  // PCRE2 match data of one split call

struct Span {
  size_t offset;
  size_t length;
};

class Regex {
 public:
  static Result<Regex> compile(const std::string& pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  const std::string& pattern() const { return pattern_; }
  void* code() const { return code_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

class PreTokenizer {
 public:
  // The regex list for a tokenizer.ggml.pre name ("llama-bpe", "qwen2", "gpt-2", ...; empty or
  // "default" for llama.cpp's default list). Unknown names are an error.
  static Result<PreTokenizer> for_name(std::string_view pre);
  static Result<PreTokenizer> from_patterns(const std::vector<std::string>& patterns);

  // Splits valid UTF-8 `text` into pieces that cover it in order. Thread-safe.
  void split(std::string_view text, std::vector<Span>& out) const;
  // The same pieces handed to `fn(ctx, piece)` one by one as they are found, without building
  // the list (the text of a whole book makes a list of a million pieces).
  using PieceFn = void (*)(void* ctx, std::string_view piece);
  void for_each_piece(std::string_view text, PieceFn fn, void* ctx) const;

  const std::vector<Regex>& regexes() const { return regexes_; }

 private:
  void split_level(std::string_view piece, size_t level, MatchState& st, PieceFn fn, void* ctx) const;
  std::vector<Regex> regexes_;
};

}  // namespace kite::tokenizer
