// kite/backends/vulkan/shaders/common.glsl — included by every shader: the extensions, the
// buffer-reference types tensors are read and written through, Rows (a 4-D row walk, the same
// layout as vk::Rows in stream.h), the flat workgroup index and f16/bf16 conversions.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference2 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_scalar_block_layout : require

// Typed views of device memory (addresses as uint64_t; `T(addr)` makes a reference).
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer F32s { float v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer I32s { int v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer U32s { uint v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 2) buffer U16s { uint16_t v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 1) buffer U8s { uint8_t v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 1) buffer I8s { int8_t v[]; };

struct Rows {
  uint64_t p;
  int ne1, ne2, ne3;
  uint nb1, nb2, nb3;
};

// Byte address of row r of a Rows walk.
uint64_t row_addr(Rows t, uint r) {
  const uint i1 = r % uint(t.ne1);
  const uint i23 = r / uint(t.ne1);
  const uint i2 = i23 % uint(t.ne2);
  const uint i3 = i23 / uint(t.ne2);
  return t.p + uint64_t(i1) * t.nb1 + uint64_t(i2) * t.nb2 + uint64_t(i3) * t.nb3;
}

// The flat index of this workgroup (dispatches are 2-D grids; see Stream::dispatch).
uint group_index() { return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; }

float f16_to_f32(uint h) { return unpackHalf2x16(h).x; }
uint f32_to_f16(float f) { return packHalf2x16(vec2(f, 0.0)) & 0xffffu; }
float bf16_to_f32(uint b) { return uintBitsToFloat(b << 16); }
// Round to nearest even, NaN kept a NaN (as the CPU's conversion).
uint f32_to_bf16(float f) {
  const uint u = floatBitsToUint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
