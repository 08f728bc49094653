// kite/backends/vulkan/shaders/get_rows.glsl — dst row r = table row ids[r] as f32, for a table
// of one type (dequant.glsl; the including get_rows_<type>.comp defines it). One invocation
// decodes one 8-element chunk. An id outside the table gives a row of zeros.
//
// Push constants: see GetRowsPush in ops_matmul.cpp (the same layout).

layout(local_size_x = 128) in;
const uint WG = 128;

layout(push_constant, scalar) uniform P {
  uint64_t table;  // row i at table + i * table_nb1
  uint64_t ids;    // n int32
  uint64_t dst;    // row r at dst + r * dst_nb1, f32
  uint table_nb1;
  uint dst_nb1;
  uint ne0;
  uint table_rows;
  uint n;
  uint unused;
  uint64_t codebooks;  // the IQ codebooks (codebook types only)
} pc;

uint64_t codebooks_address() { return pc.codebooks; }  // (declared in dequant.glsl)

void main() {
  const uint nch = chunk_count(pc.ne0);
  const uint idx = group_index() * WG + gl_LocalInvocationID.x;
  if (idx >= pc.n * nch) return;
  const uint r = idx / nch, ch = idx % nch;
  const int id = I32s(pc.ids).v[r];
  float w[8];
  if (id >= 0 && uint(id) < pc.table_rows) {
    decode_chunk(pc.table + uint64_t(id) * pc.table_nb1, ch, pc.ne0, w);
  } else {
    for (uint t = 0; t < 8; ++t) w[t] = 0.0;
  }
  uint e0, e1;
  chunk_elems(ch, e0, e1);
  F32s out_row = F32s(pc.dst + uint64_t(r) * pc.dst_nb1);
  for (uint t = 0; t < 4; ++t) {
    if (e0 + t < pc.ne0) out_row.v[e0 + t] = w[t];
    if (e1 + t < pc.ne0) out_row.v[e1 + t] = w[4 + t];
  }
}
