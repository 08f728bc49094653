// kite/src/core/tensor.h — tensors and the closed op set of the graph.
//
// A Tensor is a description: element type, shape and byte strides (ggml order: ne[0] innermost),
// where its bytes live (a buffer of some backend, at an offset; or an external pointer such as
// a weight in the file mapping), and — for a graph node — the op and sources that compute it.
// Views are cheap (they share their source's bytes); data is never owned by a Tensor.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/quant/types.h"

namespace kite {

using DType = quant::Type;

inline constexpr int kMaxDims = 4;
inline constexpr int kMaxSrc = 6;
inline constexpr int32_t kMaxTopK = 128;  // candidates per row of Op::kTopK

enum class Op : uint8_t {
  kNone,       // a leaf: input, weight or cache; bytes set from outside
  kView,       // src0's bytes seen with this tensor's ne/nb/view_offset (reshape, permute, slice)
  kGetRows,    // src0 table [n_embd, n_rows] (any type), src1 I32 ids [n] -> F32 [n_embd, n]
  kMulMat,     // src0 weights [k, m] (any type), src1 F32 [k, n] -> F32 [m, n]; + src2 F32 [m] if set
  kAdd,        // F32 src0 + src1, src1 broadcast over rows when it has fewer
  kMul,        // F32 src0 * src1, broadcast likewise
  kScale,      // F32 src0 * f[0]; with f[1] > 0 soft-capped: f[1] * tanh(src0 * f[0] / f[1])
  kRmsNorm,    // rows of src0 / rms(row) (eps f[0]); times src1 (per-column weight) if given
  kRope,       // src0 F32 [head_dim, n_head, n_tokens], src1 I32 positions [n_tokens]; see RopeParams
  kSwiglu,     // silu(src0) * src1
  kKvWrite,    // writes src1 F32 [row, n_tokens] into cache src0 [row, n_slots] at slots src2 (I32)
  kAttention,  // see attention_params; reads K/V through the block table, never a contiguous copy
  kCopy,       // src0 converted to this tensor's type (same element count, contiguous)
  kAllReduce,  // F32 src0 summed over the ranks of a tensor-parallel group (src/core/comm.h)
  kTopK,       // F32 src0 [n, rows] -> F32 [2k + 1 (+ 2), rows]: each row's k largest (Graph::top_k)
  kMulMatId,   // src0 experts [k, m, n_expert] · src1 F32 [k, 1 or n_used, n] for the experts in route src2
  kMoeSum,     // F32 src0 [m, n_used, n] summed over its n_used with the router weights of route src1
  kGeglu,      // gelu(src0) * src1 (gelu's tanh approximation)
};

const char* op_name(Op op);

// Op parameters live in small fixed arrays on the tensor (like ggml's op_params).
struct OpParams {
  std::array<float, 8> f{};
  std::array<int32_t, 8> i{};
};

class Buffer;

struct Tensor {
  DType type = DType::F32;
  std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};
  std::array<size_t, kMaxDims> nb{};  // byte strides; nb[0] is the element (or block) size
  Op op = Op::kNone;
  std::array<Tensor*, kMaxSrc> src{};
  OpParams params;
  size_t view_offset = 0;  // kView: byte offset into src0
  // The model part a node belongs to, for placing it on a backend (Graph::set_layer): -1 the
  // token embedding (and leaves), 0..n_layer-1 a transformer layer, n_layer the output head.
  int32_t layer = -1;

  // Where the bytes are: a host pointer (CPU buffers, the file mapping) or a device address,
  // according to `buffer` (nullptr = host memory owned elsewhere, e.g. a weight in the mmap).
  void* data = nullptr;
  Buffer* buffer = nullptr;

  std::string name;

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_bytes() const;  // bytes of one contiguous row of ne[0] elements
  size_t nbytes() const;     // bytes spanned (contiguous size for contiguous tensors)
  bool is_contiguous() const;
  // Pointer to row (i1, i2, i3) of host data.
  uint8_t* row_ptr(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
    return static_cast<uint8_t*>(data) + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
  }
  template <class T>
  T* host() const { return static_cast<T*>(data); }
};

// Contiguous strides for `type` and `ne`.
std::array<size_t, kMaxDims> contiguous_strides(DType type, const std::array<int64_t, kMaxDims>& ne);

// Rope variants: kNorm rotates adjacent pairs (x[2i], x[2i+1]) — llama.cpp's layout for llama
// GGUF files, whose Q/K rows are permuted to match; kNeox rotates (x[i], x[i + n_rot/2]) — the
// Hugging Face layout, used by qwen2/qwen3 and by llama loaded from safetensors.
enum class RopeMode : int32_t { kNorm = 0, kNeox = 2 };

// Rope frequency scaling kept from the model config.
enum class RopeScaling : int32_t { kNone = 0, kLinear = 1, kLlama3 = 2, kYarn = 3 };

}  // namespace kite
