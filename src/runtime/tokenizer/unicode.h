// kite/src/runtime/tokenizer/unicode.h — UTF-8 helpers shared by the tokenizers.
//
// Only encoding/decoding and validation live here: character properties come from PCRE2
// (pre-tokenizer regexes) or from the tables generated out of UnicodeData.txt (unicode_data.h).
#pragma once

#include "src/base/utf8.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kite::tokenizer {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Appends the UTF-8 encoding of `cp` (must be a Unicode scalar value).
using kite::append_utf8;

// Length of the sequence a lead byte announces (1 for ASCII and for invalid lead bytes).
inline size_t utf8_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Decodes one well-formed character at s[*pos] and advances *pos; an ill-formed sequence
// (the maximal subpart, per Unicode 15 §3.9) yields U+FFFD. *pos must be < s.size().
uint32_t decode_utf8(std::string_view s, size_t* pos);

// Appends `in` to `out` as valid UTF-8: each maximal ill-formed subpart becomes U+FFFD.
// When `final` is false an incomplete but so-far valid sequence at the end is not consumed:
// the return value is the number of bytes consumed (== in.size() when final).
size_t append_sanitized_utf8(std::string_view in, std::string& out, bool final);

bool is_valid_utf8(std::string_view s);

// GPT-2's byte-level alphabet: every byte maps to one printable code point (bytes 33..126,
// 161..172, 174..255 to themselves, the others to 256 + n in byte order).
class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();
  // UTF-8 of the code point standing for byte b.
  std::string_view encode(uint8_t b) const { return {enc_[b].data(), enc_len_[b]}; }
  // The byte a code point stands for, or -1.
  int decode(uint32_t cp) const { return cp < 512 ? dec_[cp] : -1; }

 private:
  std::array<std::array<char, 2>, 256> enc_{};
  std::array<uint8_t, 256> enc_len_{};
  std::array<int16_t, 512> dec_{};
};

const ByteLevelAlphabet& byte_level_alphabet();

}  // namespace kite::tokenizer
