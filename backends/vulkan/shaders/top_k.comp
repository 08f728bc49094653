// kite/backends/vulkan/shaders/top_k.comp — each row's k largest entries, largest first (ties:
// the lower index first; NaN and -inf never), their indices as floats, and (pc.lse != 0) the
// row's log-sum-exp: Graph::top_k. One workgroup per row, the CUDA kernel's algorithm
// (backends/cuda/k_top_k.cu): a radix select of the k-th largest key a byte at a time, a gather
// of the keys above it (and of ties, by index), a bitonic sort of the <= 128 candidates.
#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant, scalar) uniform P {
  Rows dst;
  Rows a;
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
}
