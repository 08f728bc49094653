// Per-node dispatch of the Vulkan backend: which nodes its shaders cover (the rest run on the
// CPU, placed there by the scheduler), and the op family that records each one.
#include "backends/vulkan/stream.h"

#include <limits>

namespace kite::vk {

Rows rows_of(const Tensor* t, uint64_t p) {
  Rows r;
  r.p = p;
  r.ne1 = static_cast<int32_t>(t->ne[1]), r.ne2 = static_cast<int32_t>(t->ne[2]), r.ne3 = static_cast<int32_t>(t->ne[3]);
  r.nb1 = static_cast<uint32_t>(t->nb[1]), r.nb2 = static_cast<uint32_t>(t->nb[2]), r.nb3 = static_cast<uint32_t>(t->nb[3]);
  return r;
}

Rows dense_rows(uint64_t p, int64_t ne0, int64_t rows, size_t elem) {
  Rows r;
  r.p = p;
  r.ne1 = static_cast<int32_t>(rows);
  r.nb1 = static_cast<uint32_t>(static_cast<size_t>(ne0) * elem);
  r.nb2 = r.nb3 = r.nb1 * static_cast<uint32_t>(rows);
  return r;
}

namespace {

// Shapes and strides the shaders' 32-bit index math can hold (weights are read with 64-bit
// offsets by the mul_mat shaders themselves).
bool fits_32(const Tensor* t) {
  if (t == nullptr) return true;
  constexpr auto kMax = static_cast<size_t>(std::numeric_limits<int32_t>::max());
  for (int d = 0; d < kMaxDims; ++d)
    if (static_cast<size_t>(t->ne[d]) > kMax || t->nb[d] > kMax) return false;
  return true;
}

}  // namespace

bool node_supported(const Tensor& n) {
  switch (n.op) {
    case Op::kNone:
    case Op::kView: return true;
    case Op::kMulMat:
    case Op::kGetRows: return fits_32(n.src[1]) && fits_32(&n) && matmul_supported(n);
    case Op::kAttention: return attention_supported(n);
    default:
      for (const Tensor* s : n.src)
        if (!fits_32(s)) return false;
      return fits_32(&n) && basic_supported(n);
  }
}

Status run_node(Stream& s, Tensor* n) {
  switch (n->op) {
    case Op::kNone:
    case Op::kView: return ok_status();
    case Op::kMulMat:
    case Op::kGetRows: return run_matmul(s, n);
    case Op::kAttention: return run_attention(s, n);
    default: return run_basic(s, n);
  }
}

}  // namespace kite::vk
