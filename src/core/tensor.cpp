#include "src/core/tensor.h"

namespace kite {

const char* op_name(Op op) {
  switch (op) {
    case Op::kNone: return "none";
    case Op::kView: return "view";
    case Op::kGetRows: return "get_rows";
    case Op::kMulMat: return "mul_mat";
    case Op::kAdd: return "add";
    case Op::kMul: return "mul";
    case Op::kScale: return "scale";
    case Op::kRmsNorm: return "rms_norm";
    case Op::kRope: return "rope";
    case Op::kSwiglu: return "swiglu";
    case Op::kKvWrite: return "kv_write";
    case Op::kAttention: return "attention";
    case Op::kCopy: return "copy";
    case Op::kAllReduce: return "all_reduce";
    case Op::kTopK: return "top_k";
    case Op::kMulMatId: return "mul_mat_id";
    case Op::kMoeSum: return "moe_sum";
    case Op::kGeglu: return "geglu";
  }
  return "?";
}

size_t Tensor::row_bytes() const {
  const quant::TypeTraits* tr = quant::find_traits(type);
  return static_cast<size_t>(ne[0] / tr->block_size) * tr->type_size;
}

size_t Tensor::nbytes() const {
  // Bytes from the first to one past the last element, for any strides.
  size_t bytes = row_bytes();
  for (int d = 1; d < kMaxDims; ++d) bytes += static_cast<size_t>(ne[d] - 1) * nb[d];
  return bytes;
}

bool Tensor::is_contiguous() const { return nb == contiguous_strides(type, ne); }

std::array<size_t, kMaxDims> contiguous_strides(DType type, const std::array<int64_t, kMaxDims>& ne) {
  const quant::TypeTraits* tr = quant::find_traits(type);
  std::array<size_t, kMaxDims> nb{};
  nb[0] = tr->type_size;
  nb[1] = static_cast<size_t>(ne[0] / tr->block_size) * tr->type_size;
  nb[2] = nb[1] * static_cast<size_t>(ne[1]);
  nb[3] = nb[2] * static_cast<size_t>(ne[2]);
  return nb;
}

}  // namespace kite
