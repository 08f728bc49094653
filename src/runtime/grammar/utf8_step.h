// kite/src/runtime/grammar/utf8_step.h — internal: strict UTF-8 decoding one byte at a time.
//
// Shared by the matcher (which decodes token bytes against grammar states) and the token index
// (which precomputes, per trie subtree, whether every path is valid UTF-8), so both apply
// exactly the same rules: no overlong forms, no surrogates, nothing past U+10FFFF, and a
// character cut at the end of a token only if some valid code point can still complete it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kite::grammar {

struct Utf8State {
  uint32_t cp = 0;
  uint8_t left = 0;  // continuation bytes still expected
  uint8_t len = 0;   // length of the character being read
};

enum class Utf8Step { kInvalid, kAscii, kPartial, kComplete };

inline Utf8Step utf8_step(Utf8State& u, uint8_t b) {
  static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (u.left == 0) {
    if (b < 0x80) {
      u.cp = b;
      return Utf8Step::kAscii;
    }
    if (b >= 0xc2 && b <= 0xdf) {
      u.len = 2, u.cp = b & 0x1f;
    } else if (b >= 0xe0 && b <= 0xef) {
      u.len = 3, u.cp = b & 0x0f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      u.len = 4, u.cp = b & 0x07;
    } else {
      return Utf8Step::kInvalid;
    }
    u.left = u.len - 1;
  } else {
    if ((b & 0xc0) != 0x80) return Utf8Step::kInvalid;
    u.cp = (u.cp << 6) | (b & 0x3f);
    if (--u.left == 0) {
      if (u.cp < kMinForLen[u.len] || u.cp > 0x10ffff || (u.cp >= 0xd800 && u.cp <= 0xdfff)) return Utf8Step::kInvalid;
      return Utf8Step::kComplete;
    }
  }
  const unsigned shift = 6u * u.left;
  const uint32_t lo = std::max(u.cp << shift, kMinForLen[u.len]);
  const uint32_t hi = std::min((u.cp << shift) | ((1u << shift) - 1), 0x10ffffu);
  if (lo > hi || (lo >= 0xd800 && hi <= 0xdfff)) return Utf8Step::kInvalid;
  return Utf8Step::kPartial;
}

// The code points a partial character can still become (call after kPartial).
inline void utf8_partial_range(const Utf8State& u, uint32_t& lo, uint32_t& hi) {
  static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  const unsigned shift = 6u * u.left;
  lo = std::max(u.cp << shift, kMinForLen[u.len]);
  hi = std::min((u.cp << shift) | ((1u << shift) - 1), 0x10ffffu);
}

}  // namespace kite::grammar
