// Elementwise ops (add, mul, swiglu, scale), rms_norm, rope, copy and kv_write on the Vulkan
// device. Semantics are the CPU references' (backends/cpu/ops_basic.cpp, ops_norm_rope.cpp).
//
// Shaders: binary.comp (add/mul/swiglu, src1 broadcast over rows), scale.comp, rms_norm.comp
// (a workgroup per row), rope.comp (an invocation per rotated pair; frequencies and sin/cos
// computed without the imprecise builtins, see the shader), convert_rows.comp (F32/F16/BF16 or
// Q8_0 rows to F32/F16/BF16 rows, optionally redirected to cache slots) and
// convert_rows_q8_0.comp (float rows to Q8_0 blocks, bit-exact with the reference quantizer).
// Copies from the other quantized types are not handled (supports() says no; the scheduler runs
// them on the CPU).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "backends/vulkan/stream.h"

namespace kite::vk {
namespace {

constexpr uint32_t kElemGroup = 256;  // local_size_x of binary, scale, rope, convert_rows
constexpr uint32_t kQ8Group = 64;     // local_size_x of convert_rows_q8_0
constexpr uint64_t kMaxItems = uint64_t{std::numeric_limits<uint32_t>::max()} - kElemGroup;

// The layouts of P in the shaders (scalar block layout; C++ pads to 8 at the end).
struct BinaryPush {
  Rows dst, a, b;
  uint32_t ne0 = 0, n = 0, op = 0;
};
static_assert(offsetof(BinaryPush, ne0) == 96 && sizeof(BinaryPush) <= kMaxPush);

struct ScalePush {
  Rows dst, a;
  uint32_t ne0 = 0, n = 0;
  float s = 1.f;
  float cap = 0.f;
};
static_assert(offsetof(ScalePush, s) == 72 && offsetof(ScalePush, cap) == 76 && sizeof(ScalePush) <= kMaxPush);

struct RmsNormPush {
  Rows dst, a;
  uint64_t w = 0;
  uint32_t ne0 = 0, n_rows = 0;
  float eps = 0.f;
};
static_assert(offsetof(RmsNormPush, w) == 64 && offsetof(RmsNormPush, eps) == 80 && sizeof(RmsNormPush) <= kMaxPush);

struct TopKPush {
  Rows dst, a;
  uint64_t draw = 0;
  uint32_t ne0 = 0, n_rows = 0, k = 0, lse = 0;
};
static_assert(offsetof(TopKPush, draw) == 64 && offsetof(TopKPush, ne0) == 72 && sizeof(TopKPush) <= kMaxPush);

struct RopePush {
  uint64_t src = 0, dst = 0, pos = 0, ff = 0;
  uint32_t src_nb1 = 0, src_nb2 = 0, dst_nb1 = 0, dst_nb2 = 0;
  int32_t hd = 0, n_head = 0, n_tok = 0, n_rot = 0;
  int32_t mode = 0, scaling = 0;
  uint32_t n_items = 0;
  float m1 = 0, m2 = 0, m3 = 0;
  float factor = 1.f, mscale = 1.f;
  float s[5] = {};
  uint32_t pad = 0;
};
static_assert(offsetof(RopePush, hd) == 48 && offsetof(RopePush, m1) == 76 && offsetof(RopePush, s) == 96 &&
              sizeof(RopePush) == 120);

struct ConvertPush {
  Rows src, dst;
  uint64_t dst_rows = 0;
  uint32_t src_type = 0, dst_type = 0, ne0 = 0, n = 0;
};
static_assert(offsetof(ConvertPush, dst_rows) == 64 && sizeof(ConvertPush) == 88);

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

size_t elem_size(DType t) {
  return t == DType::F32 || t == DType::I32 ? 4 : 2;
}

// Elements contiguous within a row (the shaders index them as ne0 consecutive values).
bool dense_row(const Tensor* t) {
  return t != nullptr && t->nb[0] == elem_size(t->type);
}

bool f32_rows(const Tensor* t) {
  return t != nullptr && t->type == DType::F32 && dense_row(t);
}

uint64_t groups_for(uint64_t items, uint32_t per_group) {
  return (items + per_group - 1) / per_group;
}

bool elementwise_supported(const Tensor& n) {
  const Tensor* a = n.src[0];
  if (!f32_rows(&n) || !f32_rows(a) || a->ne != n.ne) return false;
  if (static_cast<uint64_t>(n.n_elements()) > kMaxItems) return false;
  if (n.op == Op::kScale) return true;
  const Tensor* b = n.src[1];
  return f32_rows(b) && b->ne[0] == n.ne[0] && b->ne[1] >= 1 && b->ne[2] >= 1 && b->ne[3] >= 1;
}

bool rope_supported(const Tensor& n) {
  const Tensor* x = n.src[0];
  const Tensor* pos = n.src[1];
  const Tensor* ff = n.src[2];
  const int32_t mode = n.params.i[0], n_rot = n.params.i[1], scaling = n.params.i[2];
  if (!f32_rows(&n) || !f32_rows(x) || x->ne != n.ne || x->ne[3] != 1) return false;
  if (pos == nullptr || pos->type != DType::I32 || pos->ne[0] < x->ne[2]) return false;
  if (ff != nullptr && (!f32_rows(ff) || ff->ne[0] < n_rot / 2)) return false;
  if (mode != static_cast<int32_t>(RopeMode::kNorm) && mode != static_cast<int32_t>(RopeMode::kNeox)) return false;
  if (scaling < 0 || scaling > static_cast<int32_t>(RopeScaling::kYarn)) return false;
  // 2i * m1 must stay exact in the shader (m1 has 11 bits): n_rot below 2^12.
  return n_rot > 0 && n_rot % 2 == 0 && n_rot <= x->ne[0] && n_rot < 4096 &&
         static_cast<uint64_t>(n.n_elements()) <= kMaxItems;
}

// Float rows to F32/F16/BF16/Q8_0 rows, or Q8_0 rows (a KV cache) to float rows.
bool convert_supported(const Tensor* src, const Tensor* dst, DType dst_type) {
  if (static_cast<uint64_t>(src->n_elements()) > kMaxItems) return false;
  if (src->type == DType::Q8_0) return src->ne[0] % 32 == 0 && is_float(dst_type) && dense_row(dst);
  if (!is_float(src->type) || !dense_row(src)) return false;
  if (dst_type == DType::Q8_0) return dst->ne[0] % 32 == 0;
  return is_float(dst_type) && dense_row(dst);
}

// Splits log2(base) / n_rot into m1 + m2 + m3 with m1 and m2 of 11 significant bits (see
// shaders/rope.comp) and fills the scaling fields as the CPU's rope_inv_freq computes them.
void rope_frequencies(const OpParams& p, int32_t scaling, RopePush& r) {
  const float base = p.f[0];
  const double m = std::log2(static_cast<double>(base)) / r.n_rot;
  auto top_bits = [](double v) {
    if (v == 0) return 0.0;
    int e = 0;
    const double f = std::frexp(v, &e);
    return std::ldexp(std::nearbyint(std::ldexp(f, 11)), e - 11);
  };
  const double m1 = top_bits(m), m2 = top_bits(m - m1);
  r.m1 = static_cast<float>(m1);
  r.m2 = static_cast<float>(m2);
  r.m3 = static_cast<float>(m - m1 - m2);
  r.factor = p.f[1];
  r.mscale = 1.f;
  const float orig_ctx = static_cast<float>(p.i[3]);
  if (scaling == static_cast<int32_t>(RopeScaling::kLlama3)) {
    r.s[0] = orig_ctx;
    r.s[1] = p.f[2];
    r.s[2] = p.f[3];
    r.s[3] = orig_ctx / p.f[2];  // low_wavelen
    r.s[4] = orig_ctx / p.f[3];  // high_wavelen
  } else if (scaling == static_cast<int32_t>(RopeScaling::kYarn)) {
    const float two_pi = 6.283185307179586f, n_rot = static_cast<float>(r.n_rot), factor = p.f[1];
    auto corr_dim = [&](float rot) { return n_rot * std::log(orig_ctx / (rot * two_pi)) / (2.f * std::log(base)); };
    const float low = std::max(0.f, std::floor(corr_dim(p.f[4])));
    float high = std::min(n_rot - 1, std::ceil(corr_dim(p.f[5])));
    if (high == low) high += 0.001f;
    r.s[0] = low;
    r.s[1] = high;
    r.mscale = p.f[6] * (factor > 1.f ? 0.1f * std::log(factor) + 1.f : 1.f);
  }
}

Status run_binary(Stream& s, Tensor* n) {
  const uint32_t op = n->op == Op::kAdd ? 0 : n->op == Op::kMul ? 1 : n->op == Op::kSwiglu ? 2 : 3;
  return binary(s, op, n, n->src[0], n->src[1]);
}

Status run_scale(Stream& s, Tensor* n) {
  ScalePush p;
  KITE_ASSIGN_OR_RETURN(uint64_t a, s.address(n->src[0]));
  KITE_ASSIGN_OR_RETURN(uint64_t d, s.address(n));
  p.dst = rows_of(n, d);
  p.a = rows_of(n->src[0], a);
  p.ne0 = static_cast<uint32_t>(n->ne[0]);
  p.n = static_cast<uint32_t>(n->n_elements());
  p.s = n->params.f[0];
  p.cap = n->params.f[1];
  return s.dispatch("scale", p, groups_for(p.n, kElemGroup));
}

Status run_rms_norm(Stream& s, Tensor* n) {
  RmsNormPush p;
  const Tensor* a = n->src[0];
  KITE_ASSIGN_OR_RETURN(uint64_t ap, s.address(a));
  KITE_ASSIGN_OR_RETURN(uint64_t d, s.address(n));
  if (n->src[1] != nullptr) {
    KITE_ASSIGN_OR_RETURN(p.w, s.address(n->src[1]));
  }
  p.dst = rows_of(n, d);
  p.a = rows_of(a, ap);
  p.ne0 = static_cast<uint32_t>(a->ne[0]);
  p.n_rows = static_cast<uint32_t>(a->n_rows());
  p.eps = n->params.f[0];
  return s.dispatch("rms_norm", p, p.n_rows);
}

Status run_top_k(Stream& s, Tensor* n) {
  const Tensor* a = n->src[0];
  TopKPush p;
  KITE_ASSIGN_OR_RETURN(uint64_t ap, s.address(a));
  KITE_ASSIGN_OR_RETURN(uint64_t d, s.address(n));
  p.dst = rows_of(n, d);
  p.a = rows_of(a, ap);
  p.ne0 = static_cast<uint32_t>(a->ne[0]);
  p.n_rows = static_cast<uint32_t>(a->n_rows());
  p.k = static_cast<uint32_t>(n->params.i[0]);
  p.lse = n->params.i[1] != 0 ? 1u : 0u;
  if (n->src[1] != nullptr) {
    KITE_ASSIGN_OR_RETURN(p.draw, s.address(n->src[1]));
  }
  return s.dispatch("top_k", p, p.n_rows);
}

Status run_rope(Stream& s, Tensor* n) {
  const Tensor* x = n->src[0];
  RopePush p;
  KITE_ASSIGN_OR_RETURN(p.src, s.address(x));
  KITE_ASSIGN_OR_RETURN(p.pos, s.address(n->src[1]));
  KITE_ASSIGN_OR_RETURN(p.dst, s.address(n));
  int32_t scaling = n->params.i[2];
  if (n->src[2] != nullptr) {  // frequency factors replace the llama3 formula (as on the CPU)
    KITE_ASSIGN_OR_RETURN(p.ff, s.address(n->src[2]));
    if (scaling == static_cast<int32_t>(RopeScaling::kLlama3)) scaling = static_cast<int32_t>(RopeScaling::kNone);
  }
  p.src_nb1 = static_cast<uint32_t>(x->nb[1]), p.src_nb2 = static_cast<uint32_t>(x->nb[2]);
  p.dst_nb1 = static_cast<uint32_t>(n->nb[1]), p.dst_nb2 = static_cast<uint32_t>(n->nb[2]);
  p.hd = static_cast<int32_t>(x->ne[0]), p.n_head = static_cast<int32_t>(x->ne[1]);
  p.n_tok = static_cast<int32_t>(x->ne[2]);
  p.mode = n->params.i[0];
  p.n_rot = n->params.i[1];
  p.scaling = scaling;
  rope_frequencies(n->params, scaling, p);
  const uint64_t items = static_cast<uint64_t>(p.hd - p.n_rot / 2) * p.n_head * p.n_tok;
  p.n_items = static_cast<uint32_t>(items);
  return s.dispatch("rope", p, groups_for(items, kElemGroup));
}

// Rows of float `src` into `dst_type` rows of `dst` (at dst rows `slots[r]` when slots is set).
Status run_convert(Stream& s, const Tensor* src, const Tensor* dst, DType dst_type, const Tensor* slots) {
  ConvertPush p;
  KITE_ASSIGN_OR_RETURN(uint64_t sp, s.address(src));
  KITE_ASSIGN_OR_RETURN(uint64_t dp, s.address(dst));
  if (slots != nullptr) {
    KITE_ASSIGN_OR_RETURN(p.dst_rows, s.address(slots));
  }
  p.src = rows_of(src, sp);
  p.dst = rows_of(dst, dp);
  p.src_type = static_cast<uint32_t>(src->type);
  p.dst_type = static_cast<uint32_t>(dst_type);
  p.ne0 = static_cast<uint32_t>(src->ne[0]);
  if (dst_type == DType::Q8_0) {
    p.n = static_cast<uint32_t>(src->ne[0] / 32 * src->n_rows());
    return s.dispatch("convert_rows_q8_0", p, groups_for(p.n, kQ8Group));
  }
  p.n = static_cast<uint32_t>(src->n_elements());
  return s.dispatch("convert_rows", p, groups_for(p.n, kElemGroup));
}

}  // namespace

Status binary(Stream& s, uint32_t op, const Tensor* dst, const Tensor* a, const Tensor* b) {
  BinaryPush p;
  KITE_ASSIGN_OR_RETURN(uint64_t ap, s.address(a));
  KITE_ASSIGN_OR_RETURN(uint64_t bp, s.address(b));
  KITE_ASSIGN_OR_RETURN(uint64_t d, s.address(dst));
  p.dst = rows_of(dst, d);
  p.a = rows_of(a, ap);
  p.b = rows_of(b, bp);
  p.ne0 = static_cast<uint32_t>(dst->ne[0]);
  p.n = static_cast<uint32_t>(dst->n_elements());
  p.op = op;
  return s.dispatch("binary", p, groups_for(p.n, kElemGroup));
}

bool basic_supported(const Tensor& n) {
  switch (n.op) {
    case Op::kAdd:
    case Op::kMul:
    case Op::kSwiglu:
    case Op::kGeglu:
    case Op::kScale:
      return elementwise_supported(n);
    case Op::kRmsNorm: {
      const Tensor* a = n.src[0];
      const Tensor* w = n.src[1];
      if (!f32_rows(&n) || !f32_rows(a) || a->ne != n.ne) return false;
      return w == nullptr || (f32_rows(w) && w->ne[0] >= a->ne[0]);
    }
    case Op::kRope:
      return rope_supported(n);
    case Op::kTopK: {
      const Tensor* a = n.src[0];
      const Tensor* d = n.src[1];  // the draws: I32 [4, rows], dense (16 bytes a row); the row's
                                   // integer weights must fit (top_k.comp)
      const bool draws_ok = d == nullptr || (d->type == DType::I32 && d->ne[0] == 4 && d->n_rows() == a->n_rows() &&
                                             d->is_contiguous() && a->ne[0] <= (int64_t{1} << 19));
      return draws_ok && f32_rows(a) && n.params.i[0] >= 1 && n.params.i[0] <= kMaxTopK;
    }
    case Op::kCopy: {
      const Tensor* a = n.src[0];
      return a->ne[0] == n.ne[0] && a->n_rows() == n.n_rows() && convert_supported(a, &n, n.type);
    }
    case Op::kKvWrite: {
      const Tensor* cache = n.src[0];
      const Tensor* rows = n.src[1];
      const Tensor* slots = n.src[2];
      if (rows == nullptr || slots == nullptr || slots->type != DType::I32 || slots->ne[0] < rows->n_rows())
        return false;
      return f32_rows(rows) && rows->ne[0] == cache->ne[0] && convert_supported(rows, cache, cache->type);
    }
    default:
      return false;
  }
}

Status run_basic(Stream& s, Tensor* n) {
  switch (n->op) {
    case Op::kAdd:
    case Op::kMul:
    case Op::kSwiglu:
    case Op::kGeglu:
      return run_binary(s, n);
    case Op::kScale:
      return run_scale(s, n);
    case Op::kRmsNorm:
      return run_rms_norm(s, n);
    case Op::kRope:
      return run_rope(s, n);
    case Op::kTopK:
      return run_top_k(s, n);
    case Op::kCopy:
      return run_convert(s, n->src[0], n, n->type, nullptr);
    case Op::kKvWrite:
      return run_convert(s, n->src[1], n->src[0], n->src[0]->type, n->src[2]);
    default:
      break;
  }
  return make_error("vulkan: op ", op_name(n->op), " is not an elementwise, norm, rope, top-k or copy op");
}

}  // namespace kite::vk
