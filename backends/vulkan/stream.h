// kite/backends/vulkan/stream.h — what the Vulkan op code (ops*.cpp) records work with: one
// backend's command stream on a shared device. Internal to backends/vulkan.
//
// Addresses: every tensor the shaders touch is reached through its 64-bit device address
// (VK_KHR_buffer_device_address; GLSL GL_EXT_buffer_reference), passed in push constants. There
// are no descriptor sets. A tensor in one of the device's buffers has `data` = its device
// address; a weight in host memory (a leaf of the file mapping) is mirrored on the device on
// first use and shared by every backend (context) on that device.
//
// Shaders: every backends/vulkan/shaders/<name>.comp is compiled by glslc at build time and
// embedded; dispatch("<name>", ...) runs it. All shaders share one pipeline layout: push constants
// only, at most kMaxPush bytes. A barrier follows every dispatch (the next one sees its writes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "src/base/status.h"
#include "src/core/tensor.h"

namespace kite::vk {

inline constexpr size_t kMaxPush = 128;  // bytes of push constants (Vulkan's guaranteed minimum)

class Stream {
 public:
  virtual ~Stream() = default;
  // The device address of a tensor's bytes: its buffer's, or the mirror of a host weight.
  virtual Result<uint64_t> address(const Tensor* t) = 0;
  // At least `bytes` of this backend's scratch named `slot` (e.g. "mul_mat.x"; created on first
  // use; grows, never shrinks, and its address may change when it grows). Op code keeps no
  // scratch of its own: every backend (context) has its own.
  virtual Result<uint64_t> scratch(std::string_view slot, size_t bytes) = 0;
  // The device address of the IQ codebooks (quant::IqGrids), for the codebook types' shaders.
  virtual Result<uint64_t> codebooks() = 0;
  // Records shader `name` over `groups` workgroups with the given push constants. The groups are
  // laid out as a 2-D grid (x at most 65535, y as needed): shaders take their flat index from
  // group_index() (shaders/common.glsl) and must ignore indices >= the count they were given
  // (the grid can have up to 65534 more groups than asked for).
  virtual Status dispatch(std::string_view shader, const void* push, size_t push_bytes, uint64_t groups) = 0;
  // False for a CPU implementation of Vulkan (lavapipe), where kernels are shaped differently.
  virtual bool is_gpu() const = 0;
  template <class P>
  Status dispatch(std::string_view shader, const P& push, uint64_t groups) {
    static_assert(sizeof(P) <= kMaxPush, "push constants over 128 bytes");
    return dispatch(shader, &push, sizeof(P), groups);
  }
};

// A 4-D row walk of a tensor (same as the CUDA backend's): row r = (i1, i2, i3) with
// r = i1 + ne1 * (i2 + ne2 * i3), at byte p + i1*nb1 + i2*nb2 + i3*nb3. Matches `Rows` in
// shaders/common.glsl (32 bytes, 8-aligned).
struct alignas(8) Rows {
  uint64_t p = 0;
  int32_t ne1 = 1, ne2 = 1, ne3 = 1;
  uint32_t nb1 = 0, nb2 = 0, nb3 = 0;
};
static_assert(sizeof(Rows) == 32);

// Rows of tensor t at device address p (strides must fit in 32 bits: checked by the caller's
// supports()).
Rows rows_of(const Tensor* t, uint64_t p);
// A contiguous [ne0, rows] matrix of `elem`-byte elements at p.
Rows dense_rows(uint64_t p, int64_t ne0, int64_t rows, size_t elem = 4);

// Per-op code (ops.cpp dispatches by op to the op families):
bool node_supported(const Tensor& n);
Status run_node(Stream& s, Tensor* n);

// ops_matmul.cpp: mul_mat and get_rows (weights of any supported type).
bool matmul_supported(const Tensor& n);
Status run_matmul(Stream& s, Tensor* n);
// ops_basic.cpp: add, mul, scale, swiglu, rms_norm, rope, copy, kv_write; ops_attention.cpp:
// attention.
bool basic_supported(const Tensor& n);
Status run_basic(Stream& s, Tensor* n);
// dst = a (op) b of F32 rows, b's rows broadcast over dst's: op 0 add, 1 mul, 2 swiglu.
Status binary(Stream& s, uint32_t op, const Tensor* dst, const Tensor* a, const Tensor* b);
bool attention_supported(const Tensor& n);
Status run_attention(Stream& s, Tensor* n);

}  // namespace kite::vk
