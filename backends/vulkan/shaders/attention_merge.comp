// kite/backends/vulkan/shaders/attention_merge.comp — combines the partials of a token whose
// keys were split into several chunks (attention.comp), in chunk order. One workgroup per
// (token of the pass, query head); tokens with one chunk were written directly and are skipped.
#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "attention.glsl"

layout(local_size_x = 64) in;

layout(push_constant, scalar) uniform P {
  uint64_t part;  // [n_tok][n_head][max_chunks][hd + 2]
  uint64_t out_;  // F32 rows out_nb1 bytes apart
  uint64_t pos;   // I32 [all tokens]
  int max_blocks, block_size;
  int n_head, hd, n_tok, t0;
  int max_chunks;
  uint out_nb1;
  int window;
} pc;

void main() {
  const uint gi = group_index();
  const uint n_head = uint(pc.n_head);
  if (gi >= uint(pc.n_tok) * n_head) return;
  const uint h = gi % n_head, tl = gi / n_head, t = tl + uint(pc.t0);
  const uint mc = uint(pc.max_chunks), hd = uint(pc.hd), stride = hd + 2u;
  const TokenSplit sp = token_split(I32s(pc.pos).v[t], uint(pc.max_blocks) * uint(pc.block_size), mc, pc.window);
  if (sp.n_chunks <= 1u) return;
  F32s part = F32s(pc.part);
  const uint base = (tl * n_head + h) * mc * stride;
  float mx = kNegInf;
  for (uint c = 0u; c < sp.n_chunks; ++c) mx = max(mx, part.v[base + c * stride]);
  float l = 0.0;
  for (uint c = 0u; c < sp.n_chunks; ++c) l += exp(part.v[base + c * stride] - mx) * part.v[base + c * stride + 1u];
  const float inv = 1.0 / l;
  F32s out_row = F32s(pc.out_ + uint64_t(t) * pc.out_nb1 + uint64_t(h) * hd * 4ul);
  for (uint d = gl_LocalInvocationID.x; d < hd; d += 64u) {
    float o = 0.0;
    for (uint c = 0u; c < sp.n_chunks; ++c)
      o += exp(part.v[base + c * stride] - mx) * part.v[base + c * stride + 2u + d];
    out_row.v[d] = o * inv;
  }
}
