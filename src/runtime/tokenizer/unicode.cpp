// UTF-8 encode/decode/sanitize and GPT-2's byte-level alphabet.
#include "src/runtime/tokenizer/unicode.h"

namespace kite::tokenizer {

namespace {

// Result of looking at one sequence: `n` bytes belong to it; `cp` is the character or
// kReplacementChar when ill-formed; `incomplete` when the input ended inside a valid prefix.
struct Step {
  uint32_t cp;
  size_t n;
  bool valid;
  bool incomplete;
};

Step step_utf8(const uint8_t* p, size_t avail) {
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {b0, 1, true, false};
  size_t need;
  uint32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {kReplacementChar, 1, false, false};
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= avail) return {kReplacementChar, i, false, true};
    const uint8_t b = p[i];
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {kReplacementChar, i, false, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need, true, false};
}

}  // namespace

uint32_t decode_utf8(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + *pos;
  Step st = step_utf8(p, s.size() - *pos);
  *pos += st.n;
  return st.cp;
}

size_t append_sanitized_utf8(std::string_view in, std::string& out, bool final) {
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  size_t i = 0;
  size_t run = 0;  // start of a run of valid bytes not yet copied
  while (i < in.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    Step st = step_utf8(p + i, in.size() - i);
    if (st.valid) {
      i += st.n;
      continue;
    }
    if (st.incomplete && !final) {
      out.append(in.data() + run, i - run);
      return i;
    }
    out.append(in.data() + run, i - run);
    append_utf8(out, kReplacementChar);
    i += st.n;
    run = i;
  }
  out.append(in.data() + run, i - run);
  return i;
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    Step st = step_utf8(p + i, s.size() - i);
    if (!st.valid) return false;
    i += st.n;
  }
  return true;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  dec_.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
    std::string s;
    append_utf8(s, cp);
    enc_len_[b] = static_cast<uint8_t>(s.size());
    for (size_t i = 0; i < s.size(); ++i) enc_[b][i] = s[i];
    dec_[cp] = static_cast<int16_t>(b);
  }
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet kAlphabet;
  return kAlphabet;
}

}  // namespace kite::tokenizer
