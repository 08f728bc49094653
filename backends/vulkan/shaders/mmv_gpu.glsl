// kite/backends/vulkan/shaders/mmv_gpu.glsl — out[i, j] = W row i . x column j for weights of
// one type (dequant.glsl; the including mmv_gpu_<type>.comp defines it), f32 arithmetic, shaped
// for GPUs (mul_mat.glsl is the lavapipe shape).
//
// One workgroup of WG invocations computes NR weight rows x up to NC activation columns. The
// invocations split k between them: the row's chunks (dequant.glsl) are taken in units of U
// consecutive chunks of one scale group, invocation t doing units t, t + WG, t + 2 WG, ... So at
// every step neighbouring invocations read neighbouring bytes of the same row (coalesced weight
// loads: 4 bytes a lane per chunk for 4-bit codes, 16 for F16), and every invocation of the
// workgroup reads the same activation column at nearby addresses. Each invocation keeps NR x NC
// partial sums, added up across the workgroup in shared memory (no subgroup operations, so any
// subgroup size works). Workgroups are numbered column tile first (group g: column tile
// g % col_tiles, row group g / col_tiles), so the workgroups that run together share their weight
// rows in cache when n > NC.
//
// Push constants: mul_mat_push.glsl (row_tiles = ceil(m / NR)).

layout(local_size_x = 64) in;
const uint WG = 64;  // invocations per workgroup
const uint NR = 2;  // weight rows per workgroup
#ifndef MMV_NC
#define MMV_NC 8
#endif
const uint NC = MMV_NC;  // activation columns per workgroup (1: the n = 1 variants)
#if defined(W_FLOAT)
const uint U = 1;  // chunks per unit (must divide GROUP)
#else
const uint U = 2;
#endif

#include "mul_mat_push.glsl"

const uint RED = 8;  // invocations per value in the reduction's first step (divides WG)

shared float red[NR * NC][WG];
shared float red2[NR * NC][RED];

void main() {
  const uint g = group_index();
  const uint col_tiles = (pc.n + NC - 1) / NC;
  if (g >= pc.row_tiles * col_tiles) return;  // the whole workgroup: barriers stay uniform
  const uint row0 = (g / col_tiles) * NR, c0 = (g % col_tiles) * NC;
  const uint nc = min(NC, pc.n - c0);
  const uint tid = gl_LocalInvocationID.x;

  // Rows past the end repeat the last one (computed, never stored).
  uint64_t wa[NR];
  [[unroll]] for (uint r = 0; r < NR; ++r) wa[r] = pc.w + uint64_t(min(row0 + r, pc.m - 1)) * pc.w_nb1;
  uint64_t xa[NC];
  [[unroll]] for (uint c = 0; c < NC; ++c) xa[c] = row_addr(pc.x, min(c0 + c, pc.n - 1));

  float acc[NR][NC];
  [[unroll]] for (uint r = 0; r < NR; ++r)
    [[unroll]] for (uint c = 0; c < NC; ++c) acc[r][c] = 0.0;

  // Quantized rows hold whole blocks, so their chunk count is a multiple of GROUP (and of U).
  const uint n_units = (chunk_count(pc.k) + U - 1) / U;
  for (uint u = tid; u < n_units; u += WG) {
    Scales sc[NR];
    [[unroll]] for (uint r = 0; r < NR; ++r) group_scales(wa[r], (u * U) / GROUP, sc[r]);
    [[unroll]] for (uint q = 0; q < U; ++q) {
      const uint ch = u * U + q;
      uint e0, e1;
      chunk_elems(ch, e0, e1);
      float w[NR][8];
      [[unroll]] for (uint r = 0; r < NR; ++r) decode_in_group(wa[r], ch, pc.k, sc[r], w[r]);
      [[unroll]] for (uint c = 0; c < NC; ++c) {
        if (c < nc) {
          const vec4 a = Vec4s(xa[c]).v[e0 / 4], b = Vec4s(xa[c]).v[e1 / 4];
          [[unroll]] for (uint r = 0; r < NR; ++r) {
            float s = acc[r][c];
            [[unroll]] for (uint t = 0; t < 4; ++t) s = fma(w[r][t], a[t], s);
            [[unroll]] for (uint t = 0; t < 4; ++t) s = fma(w[r][4 + t], b[t], s);
            acc[r][c] = s;
          }
        }
      }
    }
  }

  // Workgroup sum of each (row, column) partial in two steps (three barriers, whatever the
  // subgroup size): RED invocations per value add WG / RED partials each, then one adds those.
  [[unroll]] for (uint r = 0; r < NR; ++r)
    [[unroll]] for (uint c = 0; c < NC; ++c) red[r * NC + c][tid] = acc[r][c];
  barrier();
  for (uint i = tid; i < NR * NC * RED; i += WG) {
    const uint v = i / RED, part = i % RED;
    if (v % NC < nc) {
      float s = 0.0;
      [[unroll]] for (uint j = 0; j < WG / RED; ++j) s += red[v][part + RED * j];
      red2[v][part] = s;
    }
  }
  barrier();
  if (tid < NR * NC) {
    const uint r = tid / NC, c = tid % NC;
    if (row0 + r < pc.m && c < nc) {
      float s = 0.0;
      [[unroll]] for (uint j = 0; j < RED; ++j) s += red2[tid][j];
      F32s(pc.dst + uint64_t(c0 + c) * pc.dst_nb1).v[row0 + r] = s;
    }
  }
}
