// kite/backends/vulkan/shaders/convert_rows.glsl — what convert_rows*.comp share: the push
// constants (rows of a float `src` to rows of `dst`; `dst_rows`, when not 0, an I32 list that
// sends source row r to destination row dst_rows[r] — kv_write) and float element loads.
layout(push_constant, scalar) uniform P {
  Rows src;
  Rows dst;
  uint64_t dst_rows;  // I32 [n_rows], or 0
  uint src_type;      // quant::Type: 0 F32, 1 F16, 30 BF16, 8 Q8_0 (to a float type)
  uint dst_type;      // 0 F32, 1 F16, 30 BF16, 8 Q8_0
  uint ne0;
  uint n;             // work items: elements (float destinations) or 32-element blocks (Q8_0)
} pc;

const uint kF32 = 0u, kF16 = 1u, kQ8_0 = 8u, kBF16 = 30u;

float load_float(uint type, uint64_t row, uint i) {
  if (type == kF32) return F32s(row).v[i];
  if (type == kQ8_0) {  // {f16 d, int8 q[32]} blocks: q * d, as the reference dequantizer
    const uint64_t b = row + uint64_t(i / 32u) * 34ul;
    return float(int(I8s(b + 2ul).v[i % 32u])) * f16_to_f32(uint(U16s(b).v[0]));
  }
  const uint h = uint(U16s(row).v[i]);
  return type == kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}

uint64_t dst_row_addr(uint r) {
  if (pc.dst_rows == 0ul) return row_addr(pc.dst, r);
  return pc.dst.p + uint64_t(I32s(pc.dst_rows).v[r]) * pc.dst.nb1;
}
