// kite/backends/vulkan/shaders/mm_tiled.glsl — out[i, j] = W row i . x column j for many
// activation columns (prefill, batches of kTiledMinCols or more) on GPUs: a shared-memory tiled
// matmul for weights of one type (dequant.glsl; the including mm_tiled_<type>.comp defines it),
// f32 arithmetic.
//
// A workgroup of 256 invocations computes a tile of BM = 64 weight rows x BN = 64 columns,
// walking k in steps of CH = 4 chunks (32 elements; "slots"). In each step every invocation
// decodes one chunk of one weight row into shared memory and copies the same chunk's 8
// activation values of one column beside it, so slot s holds the same element of k in both
// tiles whatever the type's chunk layout (dequant.glsl chunk_elems); then every invocation
// multiplies its 4 rows x 4 columns of the tile out of shared memory: two 16-byte shared loads
// per 16 multiply-adds, each weight decoded once per 64 columns (mmv_gpu.glsl: once per 8).
// Rows and columns past the end repeat the last one (computed, never stored); chunks past the
// row's end (float types with k % 32 != 0) are zeros. Workgroups are numbered column tile first
// (group g: column tile g % col_tiles, row tile g / col_tiles), so the workgroups that run
// together share their weight tile in cache.
//
// Shared memory: 16 KiB (Vulkan's guaranteed minimum). Push constants: mul_mat_push.glsl
// (row_tiles = ceil(m / BM)).

layout(local_size_x = 256) in;
const uint BM = 64;      // weight rows per workgroup
const uint BN = 64;      // activation columns per workgroup
const uint CH = 4;       // chunks per k step
const uint BK = 8 * CH;  // slots per k step

#include "mul_mat_push.glsl"

shared vec4 ws[BK][BM / 4];  // ws[s][r / 4][r % 4]: weight row r of the tile at slot s
shared vec4 xs[BK][BN / 4];  // xs[s][c / 4][c % 4]: column c of the tile at slot s

void main() {
  const uint g = group_index();
  const uint col_tiles = (pc.n + BN - 1) / BN;
  if (g >= pc.row_tiles * col_tiles) return;  // the whole workgroup: barriers stay uniform
  const uint r0 = (g / col_tiles) * BM, c0 = (g % col_tiles) * BN;
  const uint tid = gl_LocalInvocationID.x;

  // Loading: weight row (and activation column) lr of the tile, chunk lq of each step.
  const uint lr = tid % BM, lq = tid / BM;
  const uint64_t wrow = pc.w + uint64_t(min(r0 + lr, pc.m - 1)) * pc.w_nb1;
  const uint64_t xcol = row_addr(pc.x, min(c0 + lr, pc.n - 1));
  // Multiplying: rows 4 ty .. 4 ty + 3 and columns 4 tx .. 4 tx + 3 of the tile.
  const uint tx = tid % (BN / 4), ty = tid / (BN / 4);
  vec4 acc[4];  // acc[j][i]: column 4 tx + j, row 4 ty + i
  [[unroll]] for (uint j = 0; j < 4; ++j) acc[j] = vec4(0.0);

  const uint n_chunks = chunk_count(pc.k);
  for (uint ch0 = 0; ch0 < n_chunks; ch0 += CH) {
    const uint ch = ch0 + lq;
    float w[8];
    vec4 xa = vec4(0.0), xb = vec4(0.0);
    if (ch < n_chunks) {
      decode_chunk(wrow, ch, pc.k, w);
      uint e0, e1;
      chunk_elems(ch, e0, e1);
      xa = Vec4s(xcol).v[e0 / 4];
      xb = Vec4s(xcol).v[e1 / 4];
    } else {
      [[unroll]] for (uint t = 0; t < 8; ++t) w[t] = 0.0;
    }
    barrier();  // every invocation is done with the previous step's tiles
    [[unroll]] for (uint t = 0; t < 8; ++t) ws[8 * lq + t][lr / 4][lr % 4] = w[t];
    [[unroll]] for (uint t = 0; t < 4; ++t) {
      xs[8 * lq + t][lr / 4][lr % 4] = xa[t];
      xs[8 * lq + 4 + t][lr / 4][lr % 4] = xb[t];
    }
    barrier();
    [[unroll]] for (uint s = 0; s < BK; ++s) {
      const vec4 a = ws[s][ty], b = xs[s][tx];
      acc[0] = fma(a, vec4(b.x), acc[0]);
      acc[1] = fma(a, vec4(b.y), acc[1]);
      acc[2] = fma(a, vec4(b.z), acc[2]);
      acc[3] = fma(a, vec4(b.w), acc[3]);
    }
  }

  [[unroll]] for (uint j = 0; j < 4; ++j) {
    const uint c = c0 + 4 * tx + j;
    if (c < pc.n) {
      [[unroll]] for (uint i = 0; i < 4; ++i) {
        const uint r = r0 + 4 * ty + i;
        if (r < pc.m) F32s(pc.dst + uint64_t(c) * pc.dst_nb1).v[r] = acc[j][i];
      }
    }
  }
}
