// kite/backends/vulkan/shaders/mul_mat_push.glsl — the push constants of the mul_mat shaders
// (mul_mat.glsl, mmv_gpu.glsl): MulMatPush in ops_matmul.cpp, the same layout.
layout(push_constant, scalar) uniform P {
  uint64_t w;    // weight row 0; row i at w + i * w_nb1
  uint64_t dst;  // out row (column) j at dst + j * dst_nb1, f32
  Rows x;        // activation column j = row j of this walk: k f32, 16-byte aligned, readable
                 // (and zero) up to k rounded up to 8
  uint w_nb1;
  uint dst_nb1;
  uint k;
  uint m;          // weight rows
  uint n;          // activation columns
  uint row_tiles;  // ceil(m / the weight rows one workgroup computes)
  uint64_t codebooks;  // the IQ codebooks (codebook types only)
} pc;

uint64_t codebooks_address() { return pc.codebooks; }  // (declared in dequant.glsl)

layout(buffer_reference, scalar, buffer_reference_align = 16) buffer Vec4s { vec4 v[]; };
