// Lookups into the generated Unicode tables.
#include "src/runtime/tokenizer/unicode_data.h"

#include <algorithm>
#include <iterator>

namespace kite::tokenizer {

namespace {

struct CategoryRange {
  uint32_t first, last;
  uint8_t cat;
};
struct CodePair {
  uint32_t a, b;
};
struct Decomposition {
  uint32_t cp;
  uint32_t offset, length;
};

#include "unicode_tables.inc"

}  // namespace

Category general_category(uint32_t cp) {
  if (cp > 0x10FFFF) return Category::Cn;
  auto it = std::upper_bound(std::begin(kCategoryRanges), std::end(kCategoryRanges), cp,
                             [](uint32_t x, const CategoryRange& r) { return x < r.first; });
  return static_cast<Category>(std::prev(it)->cat);
}

bool is_white_space(uint32_t cp) {
  for (const CodePair& r : kWhiteSpace)
    if (cp >= r.a && cp <= r.b) return true;
  return false;
}

uint32_t simple_lowercase(uint32_t cp) {
  auto it = std::lower_bound(std::begin(kLowercase), std::end(kLowercase), cp,
                             [](const CodePair& p, uint32_t x) { return p.a < x; });
  return (it != std::end(kLowercase) && it->a == cp) ? it->b : cp;
}

void append_canonical_decomposition(uint32_t cp, std::vector<uint32_t>& out) {
  // Hangul syllables decompose algorithmically (Unicode §3.12).
  constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
  constexpr uint32_t kTCount = 28, kNCount = 21 * 28, kSCount = 19 * kNCount;
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                             [](const Decomposition& d, uint32_t x) { return d.cp < x; });
  if (it == std::end(kDecompositions) || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  out.insert(out.end(), kDecompositionData + it->offset, kDecompositionData + it->offset + it->length);
}

}  // namespace kite::tokenizer
