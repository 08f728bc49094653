// kite/backends/vulkan/shaders/scale.comp — y = a * s, or with cap > 0 cap * tanh(a * s / cap)
// (F32), one invocation per element.
#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform P {
  Rows dst;
  Rows a;
  uint ne0;
  uint n;  // elements: ne0 * rows
  float s;
  float cap;
} pc;

void main() {
  const uint idx = group_index() * 256u + gl_LocalInvocationID.x;
  if (idx >= pc.n) return;
  const uint r = idx / pc.ne0, i = idx % pc.ne0;
  const float x = F32s(row_addr(pc.a, r)).v[i];
  // (tanh of a bounded argument, which no implementation overflows)
  F32s(row_addr(pc.dst, r)).v[i] = pc.cap > 0.0 ? pc.cap * tanh(clamp(x * pc.s / pc.cap, -15.0, 15.0)) : x * pc.s;
}
