// kite/backends/vulkan/shaders/mul_mat.glsl — out[i, j] = W row i . x column j for weights of
// one type (dequant.glsl; the including mul_mat_<type>.comp defines it), f32 arithmetic.
//
// One workgroup computes a tile of ROWS weight rows x NC activation columns with no
// communication between its invocations: invocation i owns rows i, i + WG, ... (RPI of them)
// and walks the whole of k in 8-element chunks (block scales read once per group of chunks),
// decoding its rows' chunk once for all NC columns and reading each activation value once for
// all RPI rows. (Every invocation reads the
// same activations at the same time: broadcast loads on a GPU. On lavapipe, which runs the
// invocations as SIMD lanes and pays for every load per lane, the number of loads per
// multiply-add is what counts, hence the RPI x NC register tile.) Tiles are numbered row tile
// first (group g: row tile g % row_tiles, column tile g / row_tiles).
//
// Push constants: mul_mat_push.glsl (row_tiles = ceil(m / ROWS)).

layout(local_size_x = 32) in;
const uint WG = 32;
const uint RPI = 8;          // weight rows per invocation
const uint ROWS = WG * RPI;  // weight rows per workgroup
#ifndef MUL_MAT_NC
#define MUL_MAT_NC 8
#endif
const uint NC = MUL_MAT_NC;  // activation columns per workgroup (1: the n = 1 variants)

#include "mul_mat_push.glsl"

// Activation values e0..e0+3 and e1..e1+3 of the column at xa.
void load_x(uint64_t xa, uint e0, uint e1, out float xv[8]) {
  const vec4 a = Vec4s(xa).v[e0 / 4], b = Vec4s(xa).v[e1 / 4];
  [[unroll]] for (uint t = 0; t < 4; ++t) {
    xv[t] = a[t];
    xv[4 + t] = b[t];
  }
}

void main() {
  const uint g = group_index();
  const uint col_tiles = (pc.n + NC - 1) / NC;
  if (g >= pc.row_tiles * col_tiles) return;
  const uint row0 = (g % pc.row_tiles) * ROWS + gl_LocalInvocationID.x, c0 = (g / pc.row_tiles) * NC;
  const uint nc = min(NC, pc.n - c0);

  // Rows past the end repeat the last one (computed, never stored).
  uint64_t wa[RPI];
  [[unroll]] for (uint r = 0; r < RPI; ++r) wa[r] = pc.w + uint64_t(min(row0 + r * WG, pc.m - 1)) * pc.w_nb1;
  uint64_t xa[NC];
  [[unroll]] for (uint c = 0; c < NC; ++c) xa[c] = row_addr(pc.x, min(c0 + c, pc.n - 1));

  float acc[RPI][NC];
  [[unroll]] for (uint r = 0; r < RPI; ++r)
    [[unroll]] for (uint c = 0; c < NC; ++c) acc[r][c] = 0.0;

  // Group by group (chunks sharing block scales): the scales are read once per group.
  const uint n_groups = (chunk_count(pc.k) + GROUP - 1) / GROUP;
  for (uint gi = 0; gi < n_groups; ++gi) {
    Scales sc[RPI];
    [[unroll]] for (uint r = 0; r < RPI; ++r) group_scales(wa[r], gi, sc[r]);
    for (uint ch = gi * GROUP; ch < gi * GROUP + GROUP; ++ch) {
      uint e0, e1;
      chunk_elems(ch, e0, e1);
      float w[RPI][8];
      [[unroll]] for (uint r = 0; r < RPI; ++r) decode_in_group(wa[r], ch, pc.k, sc[r], w[r]);
      [[unroll]] for (uint c = 0; c < NC; ++c) {
        if (c < nc) {
          float xv[8];
          load_x(xa[c], e0, e1, xv);
          [[unroll]] for (uint r = 0; r < RPI; ++r) {
            float s = acc[r][c];
            [[unroll]] for (uint t = 0; t < 8; ++t) s = fma(w[r][t], xv[t], s);
            acc[r][c] = s;
          }
        }
      }
    }
  }

  [[unroll]] for (uint r = 0; r < RPI; ++r) {
    const uint row = row0 + r * WG;
    if (row < pc.m) {
      [[unroll]] for (uint c = 0; c < NC; ++c)
        if (c < nc) F32s(pc.dst + uint64_t(c0 + c) * pc.dst_nb1).v[row] = acc[r][c];
    }
  }
}
