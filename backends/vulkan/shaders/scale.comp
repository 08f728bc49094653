// kite/backends/vulkan/shaders/scale.comp — y = a * s (F32), one invocation per element.
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
} pc;

void main() {
  const uint idx = group_index() * 256u + gl_LocalInvocationID.x;
  if (idx >= pc.n) return;
  const uint r = idx / pc.ne0, i = idx % pc.ne0;
  F32s(row_addr(pc.dst, r)).v[i] = F32s(row_addr(pc.a, r)).v[i] * pc.s;
}
