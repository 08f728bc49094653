// kite/src/runtime/perplexity.h — perplexity over fixed-size chunks, as llama.cpp defines it.
//
// llama.cpp (`llama-perplexity -c N`): the text is tokenized once with BOS, cut into chunks of N
// tokens whose first token is replaced by BOS, and only the second half of each chunk is scored
// (predictions of tokens N/2+1 .. N-1). perplexity_chunks() takes prepared chunks and the first
// scored position, so other definitions (e.g. transformers' in reference.json) reuse it.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "src/runtime/context.h"
#include "src/runtime/tokenizer.h"

namespace kite {

struct PerplexityResult {
  double ppl = 0;
  double nll = 0;       // mean negative log-likelihood
  int64_t scored = 0;   // predictions scored
  int64_t chunks = 0;
};

// Scores, in every chunk, the predictions of tokens first+1 .. size-1 (from positions first ..
// size-2). `progress(done, total)` is called after each chunk.
Result<PerplexityResult> perplexity_chunks(Context& ctx, const std::vector<std::vector<TokenId>>& chunks,
                                           int64_t first, const std::function<void(int64_t, int64_t)>& progress = {});

// llama.cpp's definition over `tokens` (tokenized with BOS): chunks of n_ctx, BOS first,
// second half scored.
Result<PerplexityResult> perplexity_llama_cpp(Context& ctx, std::span<const TokenId> tokens, TokenId bos, int64_t n_ctx,
                                              const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace kite
