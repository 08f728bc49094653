// kite/src/runtime/tokenizer/unicode_data.h — Unicode character data for BERT normalization.
//
// The tables are generated at build time from Debian's unicode-data package (UnicodeData.txt,
// PropList.txt) by gen_unicode_tables.cpp.
#pragma once

#include <cstdint>
#include <vector>

namespace kite::tokenizer {

enum class Category : uint8_t {
  Lu,
  Ll,
  Lt,
  Lm,
  Lo,
  Mn,
  Mc,
  Me,
  Nd,
  Nl,
  No,
  Pc,
  Pd,
  Ps,
  Pe,
  Pi,
  Pf,
  Po,
  Sm,
  Sc,
  Sk,
  So,
  Zs,
  Zl,
  Zp,
  Cc,
  Cf,
  Cs,
  Co,
  Cn,
};

Category general_category(uint32_t cp);
bool is_white_space(uint32_t cp);  // the White_Space property
uint32_t simple_lowercase(uint32_t cp);
// Appends the full canonical decomposition (NFD of one character, Hangul included).
void append_canonical_decomposition(uint32_t cp, std::vector<uint32_t>& out);

inline bool is_punctuation(Category c) {
  return c >= Category::Pc && c <= Category::Po;
}
inline bool is_other(Category c) {
  return c >= Category::Cc;
}

}  // namespace kite::tokenizer
