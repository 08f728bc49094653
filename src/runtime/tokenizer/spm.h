// kite/src/runtime/tokenizer/spm.h — SentencePiece BPE (Llama 2, Mistral, Phi-3 style vocabularies).
//
// The text (spaces already escaped to U+2581) starts as one symbol per UTF-8 character; the
// adjacent pair whose concatenation is the vocabulary token with the highest score is merged
// first (leftmost on ties), as sentencepiece's BPE model does. Characters outside the
// vocabulary fall back to byte tokens <0xNN> (or <unk> when the vocabulary has none).
#pragma once

#include <string_view>
#include <vector>

#include "src/runtime/tokenizer/vocab.h"

namespace kite::tokenizer {

void spm_encode(std::string_view text, const Vocab& vocab, std::vector<TokenId>& out);

// True when no token has U+2581 right after another character (sentencepiece vocabularies
// trained with split_by_whitespace): merges then never cross the start of a word, and words can
// be encoded one by one with the same result.
bool spm_splits_at_words(const Vocab& vocab);

}  // namespace kite::tokenizer
