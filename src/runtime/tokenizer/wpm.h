// kite/src/runtime/tokenizer/wpm.h — WordPiece (BERT).
//
// Normalization as Hugging Face's BertNormalizer + BertPreTokenizer: control characters
// dropped, whitespace splits words, CJK ideographs and punctuation become one-character words,
// accents stripped (canonical decomposition, nonspacing marks removed) and lowercased when the
// model is uncased. Then greedy longest-match-first WordPiece over the vocabulary in GGUF form
// (word-initial pieces carry a leading U+2581, continuations have no "##"). A word longer than
// 100 characters or with no segmentation becomes [UNK].
#pragma once

#include <string_view>
#include <vector>

#include "src/runtime/tokenizer/vocab.h"

namespace kite::tokenizer {

void wpm_encode(std::string_view text, const Vocab& vocab, std::vector<TokenId>& out);

}  // namespace kite::tokenizer
