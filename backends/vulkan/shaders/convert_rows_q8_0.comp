// kite/backends/vulkan/shaders/convert_rows_q8_0.comp — float rows to Q8_0 blocks ({f16 d,
// int8 q[32]}, 34 bytes), one invocation per block, bit-exact with the reference quantizer
// (formats/quant/ref_legacy.cpp quantize_q8_0): d = amax / 127, id = 1 / d, q = round(x * id)
// with halves away from zero. Both divisions are corrected to the correctly rounded quotient
// (Vulkan lets a division be off by 2.5 ulp); the halves are written as 16-bit words.
#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "convert_rows.glsl"

layout(local_size_x = 64) in;

// a - q * b exactly for q within a few ulps of a / b: Dekker's product (no fused multiply-add
// assumed), then a - p is exact (Sterbenz) and only the tiny tail rounds.
float remainder_of(float a, float q, float b) {
  precise float cq = 4097.0 * q;
  precise float qh = cq - (cq - q);
  precise float ql = q - qh;
  precise float cb = 4097.0 * b;
  precise float bh = cb - (cb - b);
  precise float bl = b - bh;
  precise float p = q * b;
  precise float err = ((qh * bh - p) + qh * bl + ql * bh) + ql * bl;
  precise float r = (a - p) - err;
  return r;
}

// The float nearest a / b (a, b > 0 and normal; the quotients here never fall on a tie).
float div_rn(float a, float b) {
  float q = a / b;
  for (int it = 0; it < 4; ++it) {
    const float r = remainder_of(a, q, b);
    const float up = uintBitsToFloat(floatBitsToUint(q) + 1u);
    const float dn = uintBitsToFloat(floatBitsToUint(q) - 1u);
    precise float half_up = 0.5 * (up - q) * b;  // exact: a power of two times b
    precise float half_dn = 0.5 * (q - dn) * b;
    if (r > half_up) {
      q = up;
    } else if (-r > half_dn) {
      q = dn;
    } else {
      break;
    }
  }
  return q;
}

// round() with halves away from zero (std::round), for |x| <= 128.
float round_away(float x) {
  const float a = abs(x);
  float t = trunc(a);
  if (a - t >= 0.5) t += 1.0;
  return x < 0.0 ? -t : t;
}

void main() {
  const uint b = group_index() * 64u + gl_LocalInvocationID.x;
  if (b >= pc.n) return;
  const uint per_row = pc.ne0 / 32u;
  const uint r = b / per_row, ib = b % per_row;
  const uint64_t src = row_addr(pc.src, r);
  float amax = 0.0;
  for (uint j = 0u; j < 32u; ++j) amax = max(amax, abs(load_float(pc.src_type, src, ib * 32u + j)));
  const float d = amax > 0.0 ? div_rn(amax, 127.0) : 0.0;
  const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
  U16s blk = U16s(dst_row_addr(r) + uint64_t(ib) * 34ul);
  blk.v[0] = uint16_t(f32_to_f16(d));
  for (uint j = 0u; j < 32u; j += 2u) {
    const int q0 = int(round_away(load_float(pc.src_type, src, ib * 32u + j) * id));
    const int q1 = int(round_away(load_float(pc.src_type, src, ib * 32u + j + 1u) * id));
    blk.v[1u + j / 2u] = uint16_t((uint(q0) & 0xffu) | ((uint(q1) & 0xffu) << 8));
  }
}
