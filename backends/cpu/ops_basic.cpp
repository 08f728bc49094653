// Elementwise ops, get_rows, copy, and the row conversions they share.
#include <cmath>
#include <cstring>

#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"
#include "src/base/half.h"

namespace kite::cpu {

void row_to_f32(DType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      return;
    }
    default: quant::find_traits(type)->dequantize(src, dst, n); return;
  }
}

void row_from_f32(DType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
      return;
    }
    default: quant::find_traits(type)->quantize(src, dst, n); return;
  }
}

namespace {

// Iterates rows of dst (4-D index) split across threads; fn(dst_row, i1, i2, i3).
template <class Fn>
void for_rows(Tensor* dst, const KernelCtx& c, Fn fn) {
  int64_t begin, end;
  split(dst->n_rows(), c, &begin, &end);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t i1 = r % dst->ne[1];
    const int64_t i2 = (r / dst->ne[1]) % dst->ne[2];
    const int64_t i3 = r / (dst->ne[1] * dst->ne[2]);
    fn(reinterpret_cast<float*>(dst->row_ptr(i1, i2, i3)), i1, i2, i3);
  }
}

// Row (i1,i2,i3) of `b`, broadcast when b has fewer rows than the destination.
const float* bcast_row(const Tensor* b, int64_t i1, int64_t i2, int64_t i3) {
  return reinterpret_cast<const float*>(b->row_ptr(i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]));
}

// y = f(x, z) with z broadcast over rows: the binary elementwise ops.
template <class F>
void binary_op(Tensor* dst, const KernelCtx& c, F f) {
  const Tensor* a = dst->src[0];
  const Tensor* b = dst->src[1];
  for_rows(dst, c, [&](float* y, int64_t i1, int64_t i2, int64_t i3) {
    const auto* x = reinterpret_cast<const float*>(a->row_ptr(i1, i2, i3));
    const float* z = bcast_row(b, i1, i2, i3);
    for (int64_t i = 0; i < dst->ne[0]; ++i) y[i] = f(x[i], z[i]);
  });
}

}  // namespace

void op_add(Tensor* dst, const KernelCtx& c) { binary_op(dst, c, [](float x, float z) { return x + z; }); }

void op_mul(Tensor* dst, const KernelCtx& c) { binary_op(dst, c, [](float x, float z) { return x * z; }); }

void op_scale(Tensor* dst, const KernelCtx& c) {
  const Tensor* a = dst->src[0];
  const float s = dst->params.f[0], cap = dst->params.f[1];
  for_rows(dst, c, [&](float* y, int64_t i1, int64_t i2, int64_t i3) {
    const auto* x = reinterpret_cast<const float*>(a->row_ptr(i1, i2, i3));
    if (cap > 0.f) {
      for (int64_t i = 0; i < dst->ne[0]; ++i) y[i] = cap * std::tanh(x[i] * s / cap);
      return;
    }
    for (int64_t i = 0; i < dst->ne[0]; ++i) y[i] = x[i] * s;
  });
}

namespace {

// act(gate) * up, row by row: the level's row kernel (MatmulKernels::*row), or `scalar` per
// element without SIMD kernels.
template <class Scalar>
void glu_op(Tensor* dst, const KernelCtx& c, void (*MatmulKernels::*row)(float*, const float*, const float*, int64_t),
            Scalar scalar) {
  const Tensor* g = dst->src[0];
  const Tensor* u = dst->src[1];
  const MatmulKernels* mk = active_kernels();
  for_rows(dst, c, [&](float* y, int64_t i1, int64_t i2, int64_t i3) {
    const auto* x = reinterpret_cast<const float*>(g->row_ptr(i1, i2, i3));
    const auto* z = reinterpret_cast<const float*>(u->row_ptr(i1, i2, i3));
    if (mk != nullptr) {
      (mk->*row)(y, x, z, dst->ne[0]);
      return;
    }
    for (int64_t i = 0; i < dst->ne[0]; ++i) y[i] = scalar(x[i]) * z[i];
  });
}

}  // namespace

void op_swiglu(Tensor* dst, const KernelCtx& c) {
  glu_op(dst, c, &MatmulKernels::swiglu, [](float x) { return x / (1.f + std::exp(-x)); });
}

void op_geglu(Tensor* dst, const KernelCtx& c) {
  glu_op(dst, c, &MatmulKernels::geglu,
         [](float x) { return x / (1.f + std::exp(-2.f * kGeluC * x * (1.f + kGeluC3 * x * x))); });
}

void op_get_rows(Tensor* dst, const KernelCtx& c) {
  const Tensor* table = dst->src[0];
  const auto* ids = dst->src[1]->host<const int32_t>();
  int64_t begin, end;
  split(dst->ne[1], c, &begin, &end);
  for (int64_t r = begin; r < end; ++r)
    row_to_f32(table->type, table->row_ptr(ids[r]), reinterpret_cast<float*>(dst->row_ptr(r)), dst->ne[0]);
}

void op_copy(Tensor* dst, const KernelCtx& c) {
  const Tensor* a = dst->src[0];
  std::vector<float>& tmp = *c.scratch;
  if (tmp.size() < static_cast<size_t>(a->ne[0])) tmp.resize(static_cast<size_t>(a->ne[0]));
  int64_t begin, end;
  split(a->n_rows(), c, &begin, &end);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
    row_to_f32(a->type, a->row_ptr(i1, i2, i3), tmp.data(), a->ne[0]);
    row_from_f32(dst->type, tmp.data(), dst->row_ptr(i1, i2, i3), dst->ne[0]);
  }
}

void op_kv_write(Tensor* dst, const KernelCtx& c) {
  const Tensor* cache = dst->src[0];
  const Tensor* rows = dst->src[1];
  const auto* slots = dst->src[2]->host<const int32_t>();
  int64_t begin, end;
  split(rows->n_rows(), c, &begin, &end);
  for (int64_t r = begin; r < end; ++r)
    row_from_f32(cache->type, reinterpret_cast<const float*>(rows->row_ptr(r)), cache->row_ptr(slots[r]),
                 rows->ne[0]);
}

}  // namespace kite::cpu
