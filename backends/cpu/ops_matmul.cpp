// mul_mat: dst[m, n] = W[k, m]ᵀ-rows · x[k, n] for weights of any type (scalar reference).
#include "backends/cpu/ops.h"

namespace kite::cpu {
namespace {

float dot_f32(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums: vectorizable without reassociation flags.
  float s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

}  // namespace

void op_mul_mat(Tensor* dst, const KernelCtx& c) {
  const Tensor* w = dst->src[0];
  const Tensor* x = dst->src[1];
  const int64_t k = w->ne[0], m = w->ne[1], n = x->n_rows();
  std::vector<float>& row = *c.scratch;
  if (row.size() < static_cast<size_t>(k)) row.resize(static_cast<size_t>(k));
  int64_t begin, end;
  split(m, c, &begin, &end);
  for (int64_t i = begin; i < end; ++i) {
    const float* wr;
    if (w->type == DType::F32) {
      wr = reinterpret_cast<const float*>(w->row_ptr(i));
    } else {
      row_to_f32(w->type, w->row_ptr(i), row.data(), k);
      wr = row.data();
    }
    for (int64_t j = 0; j < n; ++j) {
      const auto* xr = reinterpret_cast<const float*>(x->row_ptr(j % x->ne[1], (j / x->ne[1]) % x->ne[2], j / (x->ne[1] * x->ne[2])));
      reinterpret_cast<float*>(dst->row_ptr(j))[i] = dot_f32(wr, xr, k);
    }
  }
}

}  // namespace kite::cpu
