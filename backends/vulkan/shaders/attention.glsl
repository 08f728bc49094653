// kite/backends/vulkan/shaders/attention.glsl — what attention.comp and attention_merge.comp
// share: the split of a token's keys into chunks (a function of the token's own length only,
// so its result never depends on what else is in the batch; the same constants as
// ops_attention.cpp on the host).
const uint kChunk = 512u;     // keys per chunk (the unit of the split)
const uint kMaxChunks = 32u;  // chunks per token at most
const float kNegInf = -3.402823466e+38;  // -FLT_MAX: exp(kNegInf - m) is 0

struct TokenSplit {
  uint lo, nk, chunk, n_chunks;
};

// Keys [lo, nk) of a token at position `pos` (capped to the table's `cap` positions; lo > 0: the
// start of a sliding window of `window` keys), its chunk length and chunk count (at most
// max_chunks, the width of the dispatch). Chunk c starts at key lo + c * chunk.
TokenSplit token_split(int pos, uint cap, uint max_chunks, int window) {
  TokenSplit s;
  s.nk = uint(clamp(pos + 1, 1, int(cap)));
  s.lo = window > 0 && s.nk > uint(window) ? s.nk - uint(window) : 0u;
  const uint raw = (s.nk - s.lo + kChunk - 1u) / kChunk;
  const uint mult = (raw + kMaxChunks - 1u) / kMaxChunks;
  s.chunk = kChunk * mult;
  s.n_chunks = min((s.nk - s.lo + s.chunk - 1u) / s.chunk, max_chunks);
  return s;
}
