// kite/backends/vulkan/shaders/convert_rows.comp — F32/F16/BF16/Q8_0 rows to F32/F16/BF16 rows
// (copy, kv_write into a float cache): one invocation per element.
#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "convert_rows.glsl"

layout(local_size_x = 256) in;

void main() {
  const uint idx = group_index() * 256u + gl_LocalInvocationID.x;
  if (idx >= pc.n) return;
  const uint r = idx / pc.ne0, i = idx % pc.ne0;
  const float v = load_float(pc.src_type, row_addr(pc.src, r), i);
  const uint64_t dst = dst_row_addr(r);
  if (pc.dst_type == kF32) {
    F32s(dst).v[i] = v;
  } else if (pc.dst_type == kF16) {
    U16s(dst).v[i] = uint16_t(f32_to_f16(v));
  } else {
    U16s(dst).v[i] = uint16_t(f32_to_bf16(v));
  }
}
