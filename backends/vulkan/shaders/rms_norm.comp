// kite/backends/vulkan/shaders/rms_norm.comp — rows of a / rms(row) (eps), times the per-column
// weight w when pc.w != 0. One workgroup per row: the sum of squares in f32 through a
// shared-memory tree, then y = x * s (* w) as the CPU computes it.
#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform P {
  Rows dst;
  Rows a;
  uint64_t w;  // F32 [ne0], or 0
  uint ne0;
  uint n_rows;
  float eps;
} pc;

shared float partial[256];

void main() {
  const uint r = group_index();
  if (r >= pc.n_rows) return;  // uniform across the workgroup
  const uint tid = gl_LocalInvocationID.x;
  F32s x = F32s(row_addr(pc.a, r));
  float sum = 0.0;
  for (uint i = tid; i < pc.ne0; i += 256u) {
    const float v = x.v[i];
    sum += v * v;
  }
  partial[tid] = sum;
  barrier();
  for (uint s = 128u; s > 0u; s >>= 1) {
    if (tid < s) partial[tid] += partial[tid + s];
    barrier();
  }
  const float scale = 1.0 / sqrt(partial[0] / float(pc.ne0) + pc.eps);
  F32s y = F32s(row_addr(pc.dst, r));
  if (pc.w != 0ul) {
    F32s w = F32s(pc.w);
    for (uint i = tid; i < pc.ne0; i += 256u) y.v[i] = x.v[i] * scale * w.v[i];
  } else {
    for (uint i = tid; i < pc.ne0; i += 256u) y.v[i] = x.v[i] * scale;
  }
}
