// kite/backends/vulkan/shaders/top_k.comp — each row's k largest entries, largest first (ties:
// the lower index first; NaN and -inf never), their indices as floats, and (pc.lse != 0) the
// row's log-sum-exp: Graph::top_k. One workgroup per row, the CUDA kernel's algorithm
// (backends/cuda/k_top_k.cu): a radix select of the k-th largest key a byte at a time, a gather
// of the keys above it (and of ties, by index), a bitonic sort of the <= 128 candidates. With
// a draw (pc.draw != 0), one more pass draws a token from the whole row (draw_token).
#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform P {
  Rows dst;
  Rows a;
  uint64_t draw;  // I32 [4, n_rows] (pack_draw: T's float bits, 0, u's double bits); 0: no draw
  uint ne0;
  uint n_rows;
  uint k;    // 1..128
  uint lse;  // 1: also the log-sum-exp
} pc;

const uint kThreads = 256u;
const uint kMaxK = 128u;
#define kNegInf uintBitsToFloat(0xff800000u)

shared uint hist[256];
shared float red_f[kThreads];
shared uint red_u[kThreads];
shared float cand_v[kMaxK];
shared int cand_i[kMaxK];
shared uint state[4];  // the chosen bin, still to take in it, its count; gathered so far

// An order-preserving key (the larger float, the larger key), on the bits alone; 0 for NaN and
// -inf, -0 as +0.
uint sort_key(float x) {
  uint u = floatBitsToUint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u || u == 0xff800000u) return 0u;
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

float tree_max(float v) {
  const uint tid = gl_LocalInvocationID.x;
  barrier();
  red_f[tid] = v;
  barrier();
  for (uint s = kThreads / 2u; s > 0u; s >>= 1) {
    if (tid < s) red_f[tid] = max(red_f[tid], red_f[tid + s]);
    barrier();
  }
  return red_f[0];
}

float tree_sum(float v) {
  const uint tid = gl_LocalInvocationID.x;
  barrier();
  red_f[tid] = v;
  barrier();
  for (uint s = kThreads / 2u; s > 0u; s >>= 1) {
    if (tid < s) red_f[tid] += red_f[tid + s];
    barrier();
  }
  return red_f[0];
}

uint tree_sum_u(uint v) {
  const uint tid = gl_LocalInvocationID.x;
  barrier();
  red_u[tid] = v;
  barrier();
  for (uint s = kThreads / 2u; s > 0u; s >>= 1) {
    if (tid < s) red_u[tid] += red_u[tid + s];
    barrier();
  }
  return red_u[0];
}

bool better(float va, int ia, float vb, int ib) { return va > vb || (va == vb && ia < ib); }

// The draw's weights exp((x - max) / T) in (0, 1] as integers of 2^-44: exact sums in any order
// (up to 2^19 entries of weight 1 fit in 63 bits). A weight under 2^-44 of the largest counts 0.
const float kWeightScale = 17592186044416.0;  // 2^44
shared uint64_t scan[kThreads];
shared int drawn_at;

uint64_t weight(float v, float m, float inv_t) { return uint64_t(exp((v - m) * inv_t) * kWeightScale); }

// floor(a * b / 2^53) for a < 2^53, b < 2^63 (the 116-bit product in 32-bit pieces).
uint64_t mul_shift53(uint64_t a, uint64_t b) {
  const uint64_t mask = 0xffffffffUL;
  const uint64_t a0 = a & mask, a1 = a >> 32, b0 = b & mask, b1 = b >> 32;
  const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const uint64_t mid = (p00 >> 32) + (p01 & mask) + (p10 & mask);
  const uint64_t lo = (p00 & mask) | (mid << 32);
  const uint64_t hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
  return (hi << 11) | (lo >> 53);
}

// Graph::top_k's draw (m = the row's largest allowed value), as the sampler's chain draws from
// the whole row: the first index, in index order, whose running weight passes u * total. Each
// invocation sums a contiguous chunk, a scan places the chunks, and the one whose chunk holds the
// target walks it. The sums are exact, so the CUDA and CPU kernels' double sums can differ from
// this only for a target within their rounding of a boundary. Writes the index and its logit.
void draw_token(F32s x, uint n, float m, uint64_t words, F32s y, uint at) {
  const uint tid = gl_LocalInvocationID.x;
  I32s w = I32s(words);
  const float t = intBitsToFloat(w.v[0]);
  if (!(t > 0.0) || !(m > kNegInf)) {  // (uniform across the workgroup)
    if (tid == 0u) {
      y.v[at] = -1.0;
      y.v[at + 1u] = kNegInf;
    }
    return;
  }
  // u in [0, 1) as u53 / 2^53 (exact for the sampler's uniforms: 53 random bits)
  const uint64_t bits = (uint64_t(uint(w.v[3])) << 32) | uint64_t(uint(w.v[2]));
  const uint e = uint(bits >> 52) & 0x7ffu;
  const uint64_t mant = (bits & 0xfffffffffffffUL) | (1UL << 52);
  const uint64_t u53 = e == 0u || e > 1022u ? 0UL : 1022u - e < 64u ? mant >> (1022u - e) : 0UL;
  const float inv_t = 1.0 / t;
  const uint per = (n + kThreads - 1u) / kThreads, begin = min(n, per * tid), end = min(n, begin + per);
  uint64_t local = 0UL;
  for (uint i = begin; i < end; ++i) {
    const float v = x.v[i];
    if (v > kNegInf) local += weight(v, m, inv_t);  // (NaN and -inf: never)
  }
  barrier();
  scan[tid] = local;
  if (tid == 0u) drawn_at = -1;
  barrier();
  for (uint off = 1u; off < kThreads; off <<= 1) {  // inclusive scan
    const uint64_t add = tid >= off ? scan[tid - off] : 0UL;
    barrier();
    scan[tid] += add;
    barrier();
  }
  const uint64_t total = scan[kThreads - 1u], start = scan[tid] - local;
  const uint64_t target = mul_shift53(u53, total);  // < total
  if (local > 0UL && start <= target && target < start + local) {
    uint64_t acc = start;
    for (uint i = begin; i < end; ++i) {
      const float v = x.v[i];
      if (!(v > kNegInf)) continue;
      acc += weight(v, m, inv_t);
      if (target < acc) {
        drawn_at = int(i);
        break;
      }
    }
  }
  barrier();
  if (tid == 0u) {
    y.v[at] = float(drawn_at);
    y.v[at + 1u] = drawn_at >= 0 ? x.v[drawn_at] : kNegInf;
  }
}

void main() {
  const uint r = group_index();
  if (r >= pc.n_rows) return;  // uniform across the workgroup
  const uint tid = gl_LocalInvocationID.x;
  F32s x = F32s(row_addr(pc.a, r));
  F32s y = F32s(row_addr(pc.dst, r));
  const uint n = pc.ne0, k = pc.k;

  // Pass 1: the top byte's histogram, the candidates' count, each thread's running max and
  // sum of exp(x - max).
  for (uint b = tid; b < 256u; b += kThreads) hist[b] = 0u;
  barrier();
  uint valid = 0u;
  float m = kNegInf, s = 0.0;
  for (uint i = tid; i < n; i += kThreads) {
    const float v = x.v[i];
    const uint key = sort_key(v);
    if (key == 0u) continue;
    ++valid;
    atomicAdd(hist[key >> 24], 1u);
    if (pc.lse != 0u) {
      if (v > m) {
        s = (m > kNegInf ? s * exp(m - v) : 0.0) + 1.0;
        m = v;
      } else {
        s += exp(v - m);
      }
    }
  }
  float lse = 0.0;
  if (pc.lse != 0u) {  // (uniform)
    const float mx = tree_max(m);
    const float sum = tree_sum(m > kNegInf ? s * exp(m - mx) : 0.0);
    lse = mx > kNegInf ? mx + log(sum) : kNegInf;
  }
  const uint n_valid = tree_sum_u(valid);
  const uint kk = min(n_valid, k);

  // Radix select: after the pass of byte `shift`, the keys starting with `prefix` hold the
  // kk-th largest, and `remaining` of them are to be taken.
  uint prefix = 0u, remaining = kk, in_bin = 0u;
  int shift = 24;
  while (kk > 0u) {
    barrier();  // the histogram is complete
    if (tid == 0u) {
      uint above = 0u;
      for (int b = 255; b >= 0; --b) {
        const uint c = hist[b];
        if (above + c >= remaining) {
          state[0] = uint(b);
          state[1] = remaining - above;
          state[2] = c;
          break;
        }
        above += c;
      }
    }
    barrier();
    prefix |= state[0] << shift;
    remaining = state[1];
    in_bin = state[2];
    if (in_bin == remaining || shift == 0) break;  // the whole bin is taken, or the key is exact
    for (uint b = tid; b < 256u; b += kThreads) hist[b] = 0u;  // (thread 0 read it before the barrier)
    barrier();
    const uint fixed_bits = 0xffffffffu << shift;
    for (uint i = tid; i < n; i += kThreads) {
      const uint key = sort_key(x.v[i]);
      if (key != 0u && (key & fixed_bits) == prefix) atomicAdd(hist[(key >> (shift - 8)) & 255u], 1u);
    }
    shift -= 8;
  }

  // Gather the keys above the threshold (any order), then the ties at it by index.
  const bool ties = kk > 0u && in_bin != remaining;
  if (tid == 0u) state[3] = 0u;
  barrier();
  if (kk > 0u) {
    for (uint i = tid; i < n; i += kThreads) {
      const uint key = sort_key(x.v[i]);
      if (key != 0u && (ties ? key > prefix : key >= prefix)) {
        const uint p = atomicAdd(state[3], 1u);
        cand_v[p] = x.v[i];
        cand_i[p] = int(i);
      }
    }
  }
  barrier();
  if (ties && tid == 0u) {  // (rare: the k-th largest value repeats past the k)
    uint p = kk - remaining;
    for (uint i = 0u; i < n && p < kk; ++i) {
      if (sort_key(x.v[i]) == prefix) {
        cand_v[p] = x.v[i];
        cand_i[p] = int(i);
        ++p;
      }
    }
  }
  // Bitonic sort of the kk candidates (padded to a power of two), best first.
  uint p2 = 1u;
  while (p2 < kk) p2 <<= 1;
  barrier();
  for (uint i = kk + tid; i < p2; i += kThreads) {
    cand_v[i] = kNegInf;
    cand_i[i] = 0x7fffffff;
  }
  for (uint size = 2u; size <= p2; size <<= 1) {
    for (uint stride = size >> 1; stride > 0u; stride >>= 1) {
      barrier();
      for (uint i = tid; i < p2; i += kThreads) {
        const uint j = i ^ stride;
        if (j <= i) continue;
        const bool best_first = (i & size) == 0u;
        const float vi = cand_v[i], vj = cand_v[j];
        const int ii = cand_i[i], ij = cand_i[j];
        if (best_first ? better(vj, ij, vi, ii) : better(vi, ii, vj, ij)) {
          cand_v[i] = vj;
          cand_v[j] = vi;
          cand_i[i] = ij;
          cand_i[j] = ii;
        }
      }
    }
  }
  barrier();
  for (uint j = tid; j < k; j += kThreads) {
    const bool have = j < kk;
    y.v[j] = have ? cand_v[j] : kNegInf;
    y.v[k + j] = have ? float(cand_i[j]) : -1.0;
  }
  if (tid == 0u) y.v[2u * k] = lse;
  if (pc.draw != 0UL) draw_token(x, n, kk > 0u ? cand_v[0] : kNegInf, pc.draw + uint64_t(r) * 16UL, y, 2u * k + 1u);
}
