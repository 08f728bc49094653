// Attention over the paged KV cache: online softmax, reading K/V block by block through the
// sequence's block table (never a contiguous copy of the cache).
#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"

namespace kite::cpu {
namespace {

// The attention op's operands, unpacked once (see Graph::attention for the contract).
struct AttnArgs {
  explicit AttnArgs(const Tensor* dst)
      : q(dst->src[0]), kc(dst->src[1]), vc(dst->src[2]), pos(dst->src[3]->host<const int32_t>()),
        seq(dst->src[4]->host<const int32_t>()), table(dst->src[5]->host<const int32_t>()),
        max_blocks(dst->src[5]->ne[0]), n_kv(dst->params.i[0]), bs(dst->params.i[1]), scale(dst->params.f[0]),
        hd(q->ne[0]), n_head(q->ne[1]), n_tok(q->ne[2]), group(n_head / n_kv) {}

  // Bytes of KV head g at position j of token t's sequence, read through the block table.
  const uint8_t* k_row(int64_t t, int64_t j, int64_t g) const { return row(kc, t, j, g); }
  const uint8_t* v_row(int64_t t, int64_t j, int64_t g) const { return row(vc, t, j, g); }

  const Tensor* q;
  const Tensor* kc;
  const Tensor* vc;
  const int32_t* pos;
  const int32_t* seq;
  const int32_t* table;
  int64_t max_blocks;
  int n_kv, bs;
  float scale;
  int64_t hd, n_head, n_tok, group;

 private:
  const uint8_t* row(const Tensor* cache, int64_t t, int64_t j, int64_t g) const {
    const int32_t* blocks = table + static_cast<int64_t>(seq[t]) * max_blocks;
    const int64_t slot = static_cast<int64_t>(blocks[j / bs]) * bs + j % bs;
    return cache->row_ptr(slot) + g * hd * static_cast<int64_t>(cache->nb[0]);
  }
};


// Two passes per (token, KV head): the scores of the group's query heads against every key (K
// rows converted once per group), a max and vectorized exp per head, then the V rows
// accumulated for the whole group.
void attention_fast(Tensor* dst, const KernelCtx& c, const MatmulKernels& mk) {
  const AttnArgs a(dst);
  const Tensor* q = a.q;
  const int32_t* pos = a.pos;
  const int64_t hd = a.hd, n_tok = a.n_tok, group = a.group;
  const int n_kv = a.n_kv;
  const float scale = a.scale;
  const bool k16 = a.kc->type == DType::F16, v16 = a.vc->type == DType::F16;
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
    const int64_t nk = pos[t] + 1;
    for (int64_t j = 0; j < nk; ++j) {
      krows[j] = a.k_row(t, j, g);
      vrows[j] = a.v_row(t, j, g);
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
  const AttnArgs a(dst);
  const Tensor* q = a.q;
  const int32_t* pos = a.pos;
  const int64_t hd = a.hd, n_head = a.n_head, n_tok = a.n_tok, group = a.group;
  const float scale = a.scale;

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
    float m = -std::numeric_limits<float>::infinity(), l = 0.f;
    for (int64_t i = 0; i < hd; ++i) acc[i] = 0.f;
    for (int64_t j = 0; j <= pos[t]; ++j) {
      row_to_f32(a.kc->type, a.k_row(t, j, g), kr, hd);
      float s = 0.f;
      for (int64_t i = 0; i < hd; ++i) s += qv[i] * kr[i];
      s *= scale;
      row_to_f32(a.vc->type, a.v_row(t, j, g), vr, hd);
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
