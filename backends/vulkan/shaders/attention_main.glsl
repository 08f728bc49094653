// kite/backends/vulkan/shaders/attention_main.glsl — attention over the paged KV cache
// (semantics: backends/cpu/ops_attention.cpp), included by attention_g<N>.comp, which define
// MAX_GROUP (the most query heads per KV head the variant holds in registers; the host takes the
// smallest that fits, so no unrolled head loop runs idle iterations).
//
// One workgroup per (token, KV head, chunk of keys): the query heads of the KV head's GQA group
// are scored against the chunk's keys, 64 keys a tile, with an online softmax; K/V rows are read
// through the sequence's block table (F32, F16, BF16 or Q8_0 caches). A token whose keys fit
// one chunk writes its output; a longer one writes partials (max, sum, unnormalized output) that
// attention_merge.comp combines in chunk order (flash-decoding). Tokens t0 .. t0 + n_tok of the
// batch are handled (the host cuts a large batch into passes so the partials stay small).
layout(local_size_x = 128) in;

const uint kThreads = 128u;
const uint kTile = 64u;  // keys per tile (two invocations per key when scoring)
const uint kMaxGroup = MAX_GROUP;  // query heads per KV head this variant holds
const uint kPerThread = (kMaxGroup + 1u) / 2u;  // heads each of a key's two invocations scores
const uint kMaxQ = 2048u;  // group * head_dim at most
const uint kF32 = 0u, kF16 = 1u, kQ8_0 = 8u, kBF16 = 30u;

layout(push_constant, scalar) uniform P {
  uint64_t q;      // F32: head h of token t at q + h*q_nb1 + t*q_nb2
  uint64_t k, v;   // cache rows [hd * n_kv, n_slots], k_nb1 / v_nb1 bytes apart
  uint64_t pos, seq, table;  // I32 [n_tok], [n_tok], [max_blocks, n_seqs]
  uint64_t out_;   // F32 [hd * n_head, n_tok], contiguous
  uint64_t part;   // partials [n_tok][n_head][max_chunks][hd + 2] of this pass
  uint q_nb1, q_nb2, k_nb1, v_nb1;
  uint types;  // the K cache's type | the V cache's << 8 | k_pairs << 16
  int window;  // sliding window: keys pos - window + 1 .. pos; 0: all
  int max_blocks, block_size;
  int n_kv, group, hd, n_tok;  // n_tok: tokens of this pass
  float scale;
  int max_chunks;
  float softcap;  // scaled scores soft-capped: softcap * tanh(score / softcap); 0: not
  int t0;  // first token of this pass
} pc;

shared vec2 qs[kMaxQ / 2u];           // [group][hd / 2]: the queries as pairs
shared float sc[kMaxGroup * kTile];   // [group][kTile] scores, then probabilities
shared uint slots[kTile];
shared float ms[kMaxGroup], ls[kMaxGroup], cr[kMaxGroup];  // running max, sum; tile correction

uint head_bytes(uint type, uint hd) {
  if (type == kQ8_0) return hd / 32u * 34u;
  return hd * (type == kF32 ? 4u : 2u);
}

// Element d of a cache head slice starting at `row`.
float kv_elem(uint type, uint64_t row, uint d) {
  if (type == kF32) return F32s(row).v[d];
  if (type == kQ8_0) {
    const uint64_t b = row + uint64_t(d / 32u) * 34ul;
    return float(int(I8s(b + 2ul).v[d % 32u])) * f16_to_f32(uint(U16s(b).v[0]));
  }
  const uint h = uint(U16s(row).v[d]);
  return type == kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}

void main() {
  const uint n_kv = uint(pc.n_kv), mc = uint(pc.max_chunks);
  const uint gi = group_index();
  if (gi >= uint(pc.n_tok) * n_kv * mc) return;
  const uint c = gi % mc, g = (gi / mc) % n_kv, tl = gi / (mc * n_kv);
  const uint t = tl + uint(pc.t0);
  const uint cap = uint(pc.max_blocks) * uint(pc.block_size);
  const TokenSplit sp = token_split(I32s(pc.pos).v[t], cap, mc, pc.window);
  if (c >= sp.n_chunks) return;  // uniform across the workgroup
  const uint k_type = pc.types & 0xffu, v_type = (pc.types >> 8) & 0xffu;
  const bool k_pairs = (pc.types >> 16) != 0u;  // K head slices 4-byte aligned: F16/BF16 pairs read as one word
  const uint j0 = sp.lo + c * sp.chunk;
  const uint j1 = min(sp.nk, j0 + sp.chunk);
  const uint G = uint(pc.group), hd = uint(pc.hd), n_head = n_kv * G;
  const uint tid = gl_LocalInvocationID.x;

  const uint hd2 = hd / 2u;
  for (uint idx = tid; idx < G * hd2; idx += kThreads) {
    const uint h = idx / hd2, d2 = idx % hd2;
    F32s qr = F32s(pc.q + uint64_t(g * G + h) * pc.q_nb1 + uint64_t(t) * pc.q_nb2);
    qs[idx] = vec2(qr.v[2u * d2], qr.v[2u * d2 + 1u]);
  }
  if (tid < G) {
    ms[tid] = kNegInf;
    ls[tid] = 0.0;
  }
  const uint64_t blocks = pc.table + uint64_t(I32s(pc.seq).v[t]) * uint64_t(pc.max_blocks) * 4ul;
  const uint bs = uint(pc.block_size);
  const uint64_t k_off = uint64_t(g) * head_bytes(k_type, hd);
  const uint64_t v_off = uint64_t(g) * head_bytes(v_type, hd);
  float acc[2][kMaxGroup];  // registers: every index below is a constant after unrolling
  [[unroll]] for (uint kk = 0u; kk < 2u; ++kk)
    [[unroll]] for (uint h = 0u; h < kMaxGroup; ++h) acc[kk][h] = 0.0;
  barrier();

  const uint jj = tid % kTile, hp = tid / kTile;  // scoring: key jj, heads hp, hp + 2, ...
  for (uint tile0 = j0; tile0 < j1; tile0 += kTile) {
    const uint n = min(kTile, j1 - tile0);
    if (tid < n) {
      const uint j = tile0 + tid;
      slots[tid] = uint(I32s(blocks).v[j / bs]) * bs + j % bs;
    }
    barrier();
    // Scores.
    if (jj < n) {
      const uint64_t kr = pc.k + uint64_t(slots[jj]) * pc.k_nb1 + k_off;
      float s[kPerThread];
      [[unroll]] for (uint u = 0u; u < kPerThread; ++u) s[u] = 0.0;
      // Pairs of elements d2 = (2i, 2i + 1) of the key against the query pairs.
      if (k_type == kQ8_0) {
        for (uint b = 0u; b < hd / 32u; ++b) {
          const uint64_t blk = kr + uint64_t(b) * 34ul;
          const float dsc = f16_to_f32(uint(U16s(blk).v[0]));
          for (uint w = 0u; w < 16u; ++w) {
            const uint pair = uint(U16s(blk).v[1u + w]);
            const vec2 kv = vec2(float(int(pair << 24) >> 24), float(int(pair << 16) >> 24)) * dsc;
            const uint d2 = b * 16u + w;
            [[unroll]] for (uint u = 0u; u < kPerThread; ++u) {
              const uint h = hp + 2u * u;
              if (h < G) s[u] += dot(qs[h * hd2 + d2], kv);
            }
          }
        }
      } else {
        for (uint d2 = 0u; d2 < hd2; ++d2) {
          vec2 kv;
          if (k_type == kF32) {
            kv = vec2(F32s(kr).v[2u * d2], F32s(kr).v[2u * d2 + 1u]);
          } else {
            const uint w = k_pairs ? U32s(kr).v[d2]
                                   : uint(U16s(kr).v[2u * d2]) | (uint(U16s(kr).v[2u * d2 + 1u]) << 16);
            kv = k_type == kF16 ? unpackHalf2x16(w) : vec2(bf16_to_f32(w & 0xffffu), bf16_to_f32(w >> 16));
          }
          [[unroll]] for (uint u = 0u; u < kPerThread; ++u) {
            const uint h = hp + 2u * u;
            if (h < G) s[u] += dot(qs[h * hd2 + d2], kv);
          }
        }
      }
      [[unroll]] for (uint u = 0u; u < kPerThread; ++u) {
        const uint h = hp + 2u * u;
        if (h < G) {
          // (soft-capped: tanh of a bounded argument, which no implementation overflows)
          const float x = s[u] * pc.scale;
          sc[h * kTile + jj] = pc.softcap > 0.0 ? pc.softcap * tanh(clamp(x / pc.softcap, -15.0, 15.0)) : x;
        }
      }
    }
    barrier();
    // Online softmax, one invocation per head.
    if (tid < G) {
      float mt = kNegInf;
      for (uint i = 0u; i < n; ++i) mt = max(mt, sc[tid * kTile + i]);
      const float m_old = ms[tid];
      const float m_new = max(m_old, mt);
      const float corr = exp(m_old - m_new);
      float sum = 0.0;
      for (uint i = 0u; i < n; ++i) {
        const float p = exp(sc[tid * kTile + i] - m_new);
        sc[tid * kTile + i] = p;
        sum += p;
      }
      ls[tid] = ls[tid] * corr + sum;
      ms[tid] = m_new;
      cr[tid] = corr;
    }
    barrier();
    // Output: invocation tid accumulates dimensions tid and tid + 128 of every head.
    [[unroll]] for (uint kk = 0u; kk < 2u; ++kk) {
      const uint d = tid + kk * kThreads;
      if (d < hd) {
        [[unroll]] for (uint h = 0u; h < kMaxGroup; ++h)
          if (h < G) acc[kk][h] *= cr[h];
        for (uint i = 0u; i < n; ++i) {
          const float vv = kv_elem(v_type, pc.v + uint64_t(slots[i]) * pc.v_nb1 + v_off, d);
          [[unroll]] for (uint h = 0u; h < kMaxGroup; ++h)
            if (h < G) acc[kk][h] += sc[h * kTile + i] * vv;
        }
      }
    }
    barrier();
  }

  [[unroll]] for (uint kk = 0u; kk < 2u; ++kk) {
    const uint d = tid + kk * kThreads;
    [[unroll]] for (uint h = 0u; h < kMaxGroup; ++h) {
      if (d < hd && h < G) {
        const uint hh = g * G + h;
        if (sp.n_chunks == 1u) {
          F32s(pc.out_ + (uint64_t(t) * n_head + hh) * hd * 4ul).v[d] = acc[kk][h] * (1.0 / ls[h]);
        } else {
          const uint rec = ((tl * n_head + hh) * mc + c) * (hd + 2u);
          F32s r = F32s(pc.part);
          r.v[rec + 2u + d] = acc[kk][h];
          if (d == 0u) {
            r.v[rec] = ms[h];
            r.v[rec + 1u] = ls[h];
          }
        }
      }
    }
  }
}
