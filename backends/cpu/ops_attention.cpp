// Attention over the paged KV cache: online softmax, reading K/V block by block through the
// sequence's block table (never a contiguous copy of the cache).
#include <cmath>
#include <limits>

#include "backends/cpu/ops.h"

namespace kite::cpu {

void op_attention(Tensor* dst, const KernelCtx& c) {
  const Tensor* q = dst->src[0];
  const Tensor* kc = dst->src[1];
  const Tensor* vc = dst->src[2];
  const auto* pos = dst->src[3]->host<const int32_t>();
  const auto* seq = dst->src[4]->host<const int32_t>();
  const Tensor* bt = dst->src[5];
  const auto* table = bt->host<const int32_t>();
  const int64_t max_blocks = bt->ne[0];
  const int n_kv = dst->params.i[0];
  const int bs = dst->params.i[1];
  const float scale = dst->params.f[0];
  const int64_t hd = q->ne[0], n_head = q->ne[1], n_tok = q->ne[2];
  const int64_t group = n_head / n_kv;

  std::vector<float>& buf = *c.scratch;  // acc | k row | v row
  if (buf.size() < static_cast<size_t>(3 * hd)) buf.resize(static_cast<size_t>(3 * hd));
  float* acc = buf.data();
  float* kr = acc + hd;
  float* vr = kr + hd;

  int64_t begin, end;
  split(n_tok * n_head, c, &begin, &end);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t h = r % n_head, t = r / n_head;
    const int64_t g = h / group;
    const auto* qv = reinterpret_cast<const float*>(q->row_ptr(h, t));
    const int32_t* blocks = table + static_cast<int64_t>(seq[t]) * max_blocks;
    float m = -std::numeric_limits<float>::infinity(), l = 0.f;
    for (int64_t i = 0; i < hd; ++i) acc[i] = 0.f;
    for (int64_t j = 0; j <= pos[t]; ++j) {
      const int64_t slot = static_cast<int64_t>(blocks[j / bs]) * bs + j % bs;
      row_to_f32(kc->type, kc->row_ptr(slot) + g * hd * static_cast<int64_t>(kc->nb[0]), kr, hd);
      float s = 0.f;
      for (int64_t i = 0; i < hd; ++i) s += qv[i] * kr[i];
      s *= scale;
      row_to_f32(vc->type, vc->row_ptr(slot) + g * hd * static_cast<int64_t>(vc->nb[0]), vr, hd);
      if (s > m) {
        const float corr = std::exp(m - s);
        l *= corr;
        for (int64_t i = 0; i < hd; ++i) acc[i] *= corr;
        m = s;
      }
      const float e = std::exp(s - m);
      l += e;
      for (int64_t i = 0; i < hd; ++i) acc[i] += e * vr[i];
    }
    auto* out = reinterpret_cast<float*>(dst->row_ptr(t)) + h * hd;
    for (int64_t i = 0; i < hd; ++i) out[i] = acc[i] / l;
  }
}

}  // namespace kite::cpu
