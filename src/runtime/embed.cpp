// Pooled embeddings over Context::decode(OutputKind::kHidden) (see embed.h).
#include "src/runtime/embed.h"

#include <algorithm>
#include <cmath>

namespace kite {

Result<Pooling> parse_pooling(std::string_view name) {
  if (name == "mean") return Pooling::kMean;
  if (name == "last") return Pooling::kLast;
  if (name == "cls") return Pooling::kCls;
  return make_error_code(ErrorCode::kInvalidArgument, "unknown pooling '", name, "' (expected mean, last or cls)");
}

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kMean:
      return "mean";
    case Pooling::kLast:
      return "last";
    case Pooling::kCls:
      return "cls";
  }
  return "?";
}

namespace {

// Runs the chunks and pools them into `sum` (double: a mean over thousands of tokens).
Status run_chunks(Context& ctx, std::span<const int32_t> tokens, const EmbedOptions& opts, int32_t seq,
                  std::vector<double>* sum) {
  const size_t n = tokens.size();
  const size_t n_batch = std::max<size_t>(opts.n_batch, 1);
  const size_t ne = sum->size();
  std::vector<BatchToken> batch;
  batch.reserve(std::min(n, n_batch));
  for (size_t start = 0; start < n; start += n_batch) {
    const size_t end = std::min(n, start + n_batch);
    batch.clear();
    for (size_t i = start; i < end; ++i) {
      const bool keep = opts.pooling == Pooling::kMean || (opts.pooling == Pooling::kCls && i == 0) ||
                        (opts.pooling == Pooling::kLast && i + 1 == n);
      batch.push_back({tokens[i], seq, keep});
    }
    KITE_TRY(ctx.decode(batch, OutputKind::kHidden));
    // Which of this step's outputs are pooled: all (mean), or the one token asked for.
    const bool wanted = opts.pooling == Pooling::kMean || (opts.pooling == Pooling::kCls && start == 0) ||
                        (opts.pooling == Pooling::kLast && end == n);
    if (!wanted) continue;  // decode kept some token's output anyway; not ours
    for (size_t o = 0; o < ctx.n_outputs(); ++o) {
      std::span<const float> h = ctx.hidden(o);
      for (size_t d = 0; d < ne; ++d) (*sum)[d] += h[d];
    }
  }
  return ok_status();
}

}  // namespace

Result<std::vector<float>> embed(Context& ctx, std::span<const int32_t> tokens, const EmbedOptions& opts, int32_t seq) {
  KvCache& kv = ctx.kv();
  if (seq < 0 || seq >= kv.n_seqs())
    return make_error_code(ErrorCode::kInvalidArgument, "embed: sequence ", seq, " out of range [0, ", kv.n_seqs(),
                           ")");
  if (tokens.empty()) return make_error_code(ErrorCode::kInvalidArgument, "embed: the input is empty (no tokens)");
  if (kv.seq_len(seq) != 0)
    return make_error_code(ErrorCode::kInvalidArgument, "embed: sequence ", seq, " is not empty (it holds ",
                           kv.seq_len(seq), " positions)");
  if (static_cast<int64_t>(tokens.size()) > kv.n_ctx())
    return make_error_code(ErrorCode::kTooLarge, "embed: the input has ", tokens.size(),
                           " tokens, more than the context's ", kv.n_ctx());

  const size_t ne = static_cast<size_t>(ctx.model().hparams().n_embd);
  std::vector<double> sum(ne, 0.0);
  const Status st = run_chunks(ctx, tokens, opts, seq, &sum);
  kv.clear(seq);  // also on error: the next input starts from an empty sequence
  if (!st) return st.error();

  const double count = opts.pooling == Pooling::kMean ? static_cast<double>(tokens.size()) : 1.0;
  double norm2 = 0;
  for (double& v : sum) {
    v /= count;
    norm2 += v * v;
  }
  const double scale = opts.normalize && norm2 > 0 ? 1.0 / std::sqrt(norm2) : 1.0;
  std::vector<float> out(ne);
  for (size_t d = 0; d < ne; ++d) out[d] = static_cast<float>(sum[d] * scale);
  return out;
}

}  // namespace kite
