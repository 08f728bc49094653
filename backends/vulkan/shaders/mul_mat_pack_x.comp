// mul_mat's activations when they cannot be read in place (a row not 16-byte aligned, or k not
// a multiple of 8): copied to dense f32 rows of kp = k rounded up to 8 elements, zero-padded.
// One invocation per element of the copy. Push constants: PackXPush in ops_matmul.cpp.
#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform P {
  Rows src;      // row j: k f32
  uint64_t dst;  // row j at dst + j * kp * 4
  uint k;
  uint kp;
  uint n;
} pc;

void main() {
  const uint idx = group_index() * 256 + gl_LocalInvocationID.x;
  if (idx >= pc.n * pc.kp) return;
  const uint j = idx / pc.kp, e = idx % pc.kp;
  F32s(pc.dst).v[idx] = e < pc.k ? F32s(row_addr(pc.src, j)).v[e] : 0.0;
}
