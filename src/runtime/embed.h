// kite/src/runtime/embed.h — sentence embeddings from a causal LM: the final hidden state after
// the final norm, pooled over the input's tokens and optionally L2-normalized.
//
//   auto ctx = Context::create(model, {.n_ctx = 512});
//   auto ids = tokenizer->encode("The cat sat on the mat.");  // BOS included
//   auto v = embed(**ctx, ids, {.pooling = Pooling::kMean});  // n_embd floats, |v| = 1
//
// The context's sequence must be empty; it is cleared again afterwards (also on error), so a
// context can embed input after input. Inputs longer than one batch are evaluated in chunks
// (the KV cache carries the earlier chunks), so the result does not depend on the batch size.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/runtime/context.h"

namespace kite {

enum class Pooling { kMean, kLast, kCls };

// "mean" | "last" | "cls"; anything else is a kInvalidArgument error naming the choices.
Result<Pooling> parse_pooling(std::string_view name);
const char* pooling_name(Pooling p);

struct EmbedOptions {
  Pooling pooling = Pooling::kMean;  // mean over ALL tokens (BOS included), the last, or the first
  bool normalize = true;             // L2-normalize (a zero vector stays zero)
  size_t n_batch = 512;              // tokens per model step (longer inputs run in chunks)
};

// Embeds one input (token ids, BOS already included by the caller's tokenizer call) on
// sequence `seq` of `ctx` (which must be empty; it is cleared again afterwards, also on error).
// Returns n_embd floats: pooled final hidden state after the final norm, L2-normalized when asked.
// Errors: an empty input or a bad sequence (kInvalidArgument), an input longer than the
// context (kTooLarge, naming both lengths), bad token ids.
Result<std::vector<float>> embed(Context& ctx, std::span<const int32_t> tokens, const EmbedOptions& opts = {},
                                 int32_t seq = 0);

}  // namespace kite
