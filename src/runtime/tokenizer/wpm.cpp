// BERT normalization and WordPiece.
#include "src/runtime/tokenizer/wpm.h"

#include <algorithm>
#include <string>

#include "src/runtime/tokenizer/unicode.h"
#include "src/runtime/tokenizer/unicode_data.h"

namespace kite::tokenizer {

namespace {

constexpr size_t kMaxWordChars = 100;  // WordPiece's max_input_chars_per_word

// The CJK blocks BERT isolates (the ranges of Hugging Face's is_chinese_char).
bool is_cjk(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_bert_punct(uint32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  return is_punctuation(general_category(c));
}

struct Word {
  std::string text;
  size_t n_chars = 0;
};

std::vector<Word> normalize_and_split(std::string_view text, bool lowercase) {
  std::vector<Word> words(1);
  auto finish = [&] {
    if (!words.back().text.empty()) words.emplace_back();
  };
  std::vector<uint32_t> chars;
  for (size_t pos = 0; pos < text.size();) {
    const uint32_t cp = decode_utf8(text, &pos);
    if (cp == 0 || cp == kReplacementChar) continue;
    if (cp == '\t' || cp == '\n' || cp == '\r' || is_white_space(cp)) {
      finish();
      continue;
    }
    if (is_other(general_category(cp))) continue;
    chars.clear();
    if (lowercase) {  // uncased: strip accents, then lowercase
      append_canonical_decomposition(cp, chars);
      chars.erase(
          std::remove_if(chars.begin(), chars.end(), [](uint32_t c) { return general_category(c) == Category::Mn; }),
          chars.end());
      for (uint32_t& c : chars) c = simple_lowercase(c);
    } else {
      chars.push_back(cp);
    }
    for (uint32_t c : chars) {
      if (is_bert_punct(c) || is_cjk(c)) {
        finish();
        append_utf8(words.back().text, c);
        words.back().n_chars = 1;
        words.emplace_back();
      } else {
        append_utf8(words.back().text, c);
        words.back().n_chars++;
      }
    }
  }
  if (words.back().text.empty()) words.pop_back();
  return words;
}

}  // namespace

void wpm_encode(std::string_view text, const Vocab& vocab, std::vector<TokenId>& out) {
  static constexpr std::string_view kMark = "\xE2\x96\x81";
  std::string key;
  for (const Word& w : normalize_and_split(text, vocab.lowercase)) {
    const size_t start_size = out.size();
    bool ok = w.n_chars <= kMaxWordChars;
    for (size_t pos = 0; ok && pos < w.text.size();) {
      const std::string_view prefix = pos == 0 ? kMark : std::string_view();
      size_t end = std::min(w.text.size(), pos + vocab.max_token_len);
      TokenId found = kNoToken;
      for (; end > pos; --end) {
        if (end < w.text.size() && (static_cast<uint8_t>(w.text[end]) & 0xC0) == 0x80) continue;
        key.assign(prefix);
        key.append(w.text, pos, end - pos);
        found = vocab.find(key);
        if (found != kNoToken) break;
      }
      if (found == kNoToken) {
        ok = false;
        break;
      }
      out.push_back(found);
      pos = end;
    }
    if (!ok) {
      out.resize(start_size);
      if (vocab.unk != kNoToken) out.push_back(vocab.unk);
    }
  }
}

}  // namespace kite::tokenizer
