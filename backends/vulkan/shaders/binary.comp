// kite/backends/vulkan/shaders/binary.comp — y = a + b, a * b, silu(a) * b or gelu(a) * b
// (pc.op 0, 1, 2, 3; gelu's tanh form as the CPU computes it), F32, one invocation per element;
// b is broadcast over rows (its dims repeat, as on the CPU).
#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform P {
  Rows dst;
  Rows a;
  Rows b;
  uint ne0;
  uint n;   // elements: ne0 * rows of dst
  uint op;  // 0 add, 1 mul, 2 swiglu, 3 geglu
} pc;

void main() {
  const uint idx = group_index() * 256u + gl_LocalInvocationID.x;
  if (idx >= pc.n) return;
  const uint r = idx / pc.ne0, i = idx % pc.ne0;
  const uint i1 = r % uint(pc.dst.ne1);
  const uint i23 = r / uint(pc.dst.ne1);
  const uint i2 = i23 % uint(pc.dst.ne2), i3 = i23 / uint(pc.dst.ne2);
  const uint64_t b_row = pc.b.p + uint64_t(i1 % uint(pc.b.ne1)) * pc.b.nb1 +
                         uint64_t(i2 % uint(pc.b.ne2)) * pc.b.nb2 + uint64_t(i3 % uint(pc.b.ne3)) * pc.b.nb3;
  const float x = F32s(row_addr(pc.a, r)).v[i];
  const float z = F32s(b_row).v[i];
  float y;
  if (pc.op == 0u) {
    y = x + z;
  } else if (pc.op == 1u) {
    y = x * z;
  } else if (pc.op == 2u) {
    y = x / (1.0 + exp(-x)) * z;
  } else {
    y = x / (1.0 + exp(-1.5957691216057308 * x * (1.0 + 0.044715 * x * x))) * z;
  }
  F32s(row_addr(pc.dst, r)).v[i] = y;
}
