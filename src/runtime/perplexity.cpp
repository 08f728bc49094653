#include "src/runtime/perplexity.h"

#include <cmath>

namespace kite {

Result<PerplexityResult> perplexity_chunks(Context& ctx, const std::vector<std::vector<TokenId>>& chunks,
                                           int64_t first, const std::function<void(int64_t, int64_t)>& progress) {
  PerplexityResult r;
  double nll = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const auto& chunk = chunks[c];
    if (static_cast<int64_t>(chunk.size()) <= first + 1) return make_error("perplexity: chunk ", c, " is too short");
    ctx.kv().clear(0);
    KITE_TRY(ctx.eval(chunk, 0, /*all_logits=*/true));
    for (size_t j = static_cast<size_t>(first); j + 1 < chunk.size(); ++j) {
      auto logits = ctx.logits(j);
      float max_l = logits[0];
      for (float v : logits) max_l = std::max(max_l, v);
      double sum = 0;
      for (float v : logits) sum += std::exp(static_cast<double>(v - max_l));
      nll += std::log(sum) + max_l - logits[static_cast<size_t>(chunk[j + 1])];
      ++r.scored;
    }
    ++r.chunks;
    if (progress) progress(r.chunks, static_cast<int64_t>(chunks.size()));
  }
  ctx.kv().clear(0);
  if (r.scored == 0) return make_error("perplexity: nothing to score");
  r.nll = nll / static_cast<double>(r.scored);
  r.ppl = std::exp(r.nll);
  return r;
}

Result<PerplexityResult> perplexity_llama_cpp(Context& ctx, std::span<const TokenId> tokens, TokenId bos, int64_t n_ctx,
                                              const std::function<void(int64_t, int64_t)>& progress) {
  if (n_ctx < 4) return make_error("perplexity: context ", n_ctx, " is too small");
  const int64_t n_chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (n_chunks == 0)
    return make_error("perplexity: the text has ", tokens.size(), " tokens, fewer than one chunk of ", n_ctx);
  std::vector<std::vector<TokenId>> chunks(static_cast<size_t>(n_chunks));
  for (int64_t c = 0; c < n_chunks; ++c) {
    auto& chunk = chunks[static_cast<size_t>(c)];
    chunk.assign(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx);
    if (bos != kNoToken) chunk[0] = bos;
  }
  return perplexity_chunks(ctx, chunks, n_ctx / 2, progress);
}

}  // namespace kite
