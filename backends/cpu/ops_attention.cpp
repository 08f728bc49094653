// Attention over the paged KV cache: online softmax, reading K/V block by block through the
// sequence's block table (never a contiguous copy of the cache).
#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"

namespace kite::cpu {
namespace {

// Two passes per (token, KV head): the scores of the group's query heads against every key (K
// rows converted once per group), a max and vectorized exp per head, then the V rows
// accumulated for the whole group.
void attention_fast(Tensor* dst, const KernelCtx& c, const MatmulKernels& mk) {
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
  const bool k16 = kc->type == DType::F16, v16 = vc->type == DType::F16;
  constexpr int64_t kMaxGroup = 8;

  int64_t begin, end;
  split(n_tok * n_kv, c, &begin, &end);
  int64_t max_keys = 0;
  for (int64_t r = begin; r < end; ++r) max_keys = std::max<int64_t>(max_keys, pos[r / n_kv] + 1);
  // Scratch: acc [kMaxGroup * hd] | scores [kMaxGroup * max_keys] | row pointers (2 * max_keys).
  const size_t floats = static_cast<size_t>(kMaxGroup * (hd + max_keys)) +
                        2 * static_cast<size_t>(max_keys) * sizeof(void*) / sizeof(float) + 2;
  std::vector<float>& buf = *c.scratch;
  if (buf.size() < floats) buf.resize(floats);
  float* acc = buf.data();
  float* s = acc + kMaxGroup * hd;
  auto** krows = reinterpret_cast<const uint8_t**>(s + kMaxGroup * max_keys);
  const uint8_t** vrows = krows + max_keys;

  for (int64_t r = begin; r < end; ++r) {
    const int64_t g = r % n_kv, t = r / n_kv;
    const int32_t* blocks = table + static_cast<int64_t>(seq[t]) * max_blocks;
    const int64_t nk = pos[t] + 1;
    for (int64_t j = 0; j < nk; ++j) {
      const int64_t slot = static_cast<int64_t>(blocks[j / bs]) * bs + j % bs;
      krows[j] = kc->row_ptr(slot) + g * hd * static_cast<int64_t>(kc->nb[0]);
      vrows[j] = vc->row_ptr(slot) + g * hd * static_cast<int64_t>(vc->nb[0]);
    }
    for (int64_t h0 = 0; h0 < group; h0 += kMaxGroup) {
      const int ng = static_cast<int>(std::min(kMaxGroup, group - h0));
      const float* qs[kMaxGroup];
      for (int h = 0; h < ng; ++h) qs[h] = reinterpret_cast<const float*>(q->row_ptr(g * group + h0 + h, t));
      mk.attn_scores(qs, ng, krows, k16, nk, hd, scale, s);
      float inv[kMaxGroup];
      for (int h = 0; h < ng; ++h) {
        float* sh = s + h * nk;
        const float m = *std::max_element(sh, sh + nk);
        inv[h] = 1.f / mk.exp_sub_sum(sh, nk, m);
      }
      mk.attn_accum(s, ng, vrows, v16, nk, hd, acc);
      for (int h = 0; h < ng; ++h) {
        auto* out = reinterpret_cast<float*>(dst->row_ptr(t)) + (g * group + h0 + h) * hd;
        for (int64_t i = 0; i < hd; ++i) out[i] = acc[h * hd + i] * inv[h];
      }
    }
  }
}

}  // namespace

void op_attention(Tensor* dst, const KernelCtx& c) {
  const MatmulKernels* mk = active_kernels();
  const DType kt = dst->src[1]->type, vt = dst->src[2]->type;
  if (mk != nullptr && (kt == DType::F16 || kt == DType::F32) && (vt == DType::F16 || vt == DType::F32)) {
    attention_fast(dst, c, *mk);
    return;
  }
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
