// Attention over the paged KV cache, reading K/V block by block through the sequence's block
// table (never a contiguous copy of the cache). K/V caches are F32, F16, BF16 or Q8_0.
//
// Fast path (SIMD levels): keys are cut into chunks of kChunk positions at fixed boundaries
// (0, kChunk, 2 kChunk, ...). A chunk gives each query head a partial (max score m, sum of
// exponentials l, unnormalized output o); the partials of a (token, KV head) are merged in
// chunk order by one function. Usually one thread does all chunks of a (token, KV head); when
// a token's keys are a large share of the step's work (one long sequence decoding, few KV
// heads, many threads) its chunks are spread over the threads (flash-decoding) and merged after
// a barrier. Either way the arithmetic is the same, so a sequence's result does not depend on
// what shares its batch or on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KITE_ATTN_X86 1
#endif

namespace kite::cpu {
namespace {

// Bytes of `n` elements of a row of `type` (n a whole number of blocks).
size_t span_bytes(const Tensor* t, int64_t n) {
  const quant::TypeTraits* tr = quant::find_traits(t->type);
  const int64_t bs = tr != nullptr && tr->block_size > 0 ? tr->block_size : 1;
  return static_cast<size_t>(n / bs) * t->nb[0];
}

// The attention op's operands, unpacked once (see Graph::attention for the contract).
struct AttnArgs {
  explicit AttnArgs(const Tensor* dst)
      : q(dst->src[0]), kc(dst->src[1]), vc(dst->src[2]), pos(dst->src[3]->host<const int32_t>()),
        seq(dst->src[4]->host<const int32_t>()), table(dst->src[5]->host<const int32_t>()),
        max_blocks(dst->src[5]->ne[0]), n_kv(dst->params.i[0]), bs(dst->params.i[1]), scale(dst->params.f[0]),
        hd(q->ne[0]), n_head(q->ne[1]), n_tok(q->ne[2]), group(n_head / n_kv), k_head(span_bytes(kc, hd)),
        v_head(span_bytes(vc, hd)) {}

  // Bytes of KV head g at position j of token t's sequence, read through the block table.
  const uint8_t* k_row(int64_t t, int64_t j, int64_t g) const { return row(kc, k_head, t, j, g); }
  const uint8_t* v_row(int64_t t, int64_t j, int64_t g) const { return row(vc, v_head, t, j, g); }

  const Tensor* q;
  const Tensor* kc;
  const Tensor* vc;
  const int32_t* pos;
  const int32_t* seq;
  const int32_t* table;
  int64_t max_blocks;
  int n_kv, bs;
  float scale;
  int64_t hd, n_head, n_tok, group;
  size_t k_head, v_head;  // bytes of one KV head's slice of a cache row

 private:
  const uint8_t* row(const Tensor* cache, size_t head_bytes, int64_t t, int64_t j, int64_t g) const {
    const int32_t* blocks = table + static_cast<int64_t>(seq[t]) * max_blocks;
    const int64_t slot = static_cast<int64_t>(blocks[j / bs]) * bs + j % bs;
    return cache->row_ptr(slot) + static_cast<size_t>(g) * head_bytes;
  }
};

constexpr int64_t kChunk = 512;  // keys per chunk (a partial softmax)
constexpr int64_t kMaxGroup = 8;  // query heads scored together against one K/V row

#ifdef KITE_ATTN_X86
// AVX2 row kernels for a group of NG query heads sharing K/V rows, the head count a template
// parameter so the accumulators stay in registers. (Compiled for AVX2 by attribute; only called
// when the active level has AVX2.)
#define KITE_AVX2 __attribute__((target("avx2,fma,f16c")))

struct LoadF32 {
  static int64_t bytes(int64_t n) { return 4 * n; }
  KITE_AVX2 static __m256 load8(const uint8_t* r, int64_t i) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(r) + i);
  }
};
struct LoadF16 {
  static int64_t bytes(int64_t n) { return 2 * n; }
  KITE_AVX2 static __m256 load8(const uint8_t* r, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2 * i)));
  }
};
struct LoadQ8 {  // Q8_0 blocks: half scale, 32 int8 codes
  static int64_t bytes(int64_t n) { return n / 32 * static_cast<int64_t>(sizeof(quant::BlockQ8_0)); }
  KITE_AVX2 static __m256 load8(const uint8_t* r, int64_t i) {
    const uint8_t* b = r + i / 32 * static_cast<int64_t>(sizeof(quant::BlockQ8_0));
    uint16_t dh;
    std::memcpy(&dh, b, 2);
    int64_t codes;
    std::memcpy(&codes, b + 2 + i % 32, 8);
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(codes)));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dh)), v);
  }
};

// Keys prefetched ahead of use: a head's slice of a cache row starts a cache line the hardware
// prefetcher does not predict (rows of a block are a whole row apart, blocks are scattered).
constexpr int64_t kAhead = 8;
inline void prefetch_span(const uint8_t* p, int64_t bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + bytes - 1), _MM_HINT_T0);
}

KITE_AVX2 inline float hsum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// s[h * n + j] = scale * q[h] · k_j (hd a multiple of 8).
template <int NG, class L>
KITE_AVX2 void scores_t(const float* const* q, const uint8_t* const* krows, int64_t n, int64_t hd, float scale,
                        float* s) {
  const int64_t row_span = L::bytes(hd);
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) prefetch_span(krows[j + kAhead], row_span);
    __m256 acc[NG];
    for (int h = 0; h < NG; ++h) acc[h] = _mm256_setzero_ps();
    for (int64_t i = 0; i < hd; i += 8) {
      const __m256 kv = L::load8(krows[j], i);
      for (int h = 0; h < NG; ++h) acc[h] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q[h] + i), acc[h]);
    }
    for (int h = 0; h < NG; ++h) s[h * n + j] = hsum8(acc[h]) * scale;
  }
}

// acc[h * hd + i] = sum_j p[h * n + j] * v_j[i] (hd a multiple of 8).
template <int NG, class L>
KITE_AVX2 void accum_t(const float* p, const uint8_t* const* vrows, int64_t n, int64_t hd, float* acc) {
  for (int64_t i = 0; i < hd; i += 8) {
    __m256 a[NG];
    for (int h = 0; h < NG; ++h) a[h] = _mm256_setzero_ps();
    if (i == 0)
      for (int64_t j = 0; j < std::min(n, kAhead); ++j) prefetch_span(vrows[j], L::bytes(hd));
    for (int64_t j = 0; j < n; ++j) {
      if (i == 0 && j + kAhead < n) prefetch_span(vrows[j + kAhead], L::bytes(hd));
      const __m256 v = L::load8(vrows[j], i);
      for (int h = 0; h < NG; ++h) a[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + h * n + j), v, a[h]);
    }
    for (int h = 0; h < NG; ++h) _mm256_storeu_ps(acc + h * hd + i, a[h]);
  }
}

template <class L>
void scores_avx2(int ng, const float* const* q, const uint8_t* const* krows, int64_t n, int64_t hd, float scale,
                 float* s) {
  switch (ng) {
    case 1: return scores_t<1, L>(q, krows, n, hd, scale, s);
    case 2: return scores_t<2, L>(q, krows, n, hd, scale, s);
    case 3: return scores_t<3, L>(q, krows, n, hd, scale, s);
    case 4: return scores_t<4, L>(q, krows, n, hd, scale, s);
    case 5: return scores_t<5, L>(q, krows, n, hd, scale, s);
    case 6: return scores_t<6, L>(q, krows, n, hd, scale, s);
    case 7: return scores_t<7, L>(q, krows, n, hd, scale, s);
    default: return scores_t<8, L>(q, krows, n, hd, scale, s);
  }
}

template <class L>
void accum_avx2(int ng, const float* p, const uint8_t* const* vrows, int64_t n, int64_t hd, float* acc) {
  switch (ng) {
    case 1: return accum_t<1, L>(p, vrows, n, hd, acc);
    case 2: return accum_t<2, L>(p, vrows, n, hd, acc);
    case 3: return accum_t<3, L>(p, vrows, n, hd, acc);
    case 4: return accum_t<4, L>(p, vrows, n, hd, acc);
    case 5: return accum_t<5, L>(p, vrows, n, hd, acc);
    case 6: return accum_t<6, L>(p, vrows, n, hd, acc);
    case 7: return accum_t<7, L>(p, vrows, n, hd, acc);
    default: return accum_t<8, L>(p, vrows, n, hd, acc);
  }
}
#endif

// Cache types the fast path reads: F16 and F32 (any head size), Q8_0 (AVX2 row kernels).
bool fast_type(DType t) {
#ifdef KITE_ATTN_X86
  if (t == DType::Q8_0) return true;
#endif
  return t == DType::F16 || t == DType::F32;
}

// Per-thread scratch of the fast path, carved out of KernelCtx::scratch.
struct Scratch {
  float* s;             // scores [kMaxGroup][kChunk]
  float* acc;           // [kMaxGroup][hd]
  const uint8_t** krows;  // [kChunk]
  const uint8_t** vrows;  // [kChunk]
  const uint8_t** krow0;  // [kChunk] whole cache rows of the chunk's keys
  const uint8_t** vrow0;  // [kChunk]
  float* part;          // one token's partials: [chunks][n_head][hd + 2]
};

// Scores of query heads h0..h0+ng of token t (KV head g) against n keys: s[h * n + j].
void scores(const AttnArgs& a, const MatmulKernels& mk, const Scratch& sc, int64_t t, int64_t g, int64_t h0,
            int ng, int64_t n) {
  const int64_t hd = a.hd;
  const float* qs[kMaxGroup];
  for (int h = 0; h < ng; ++h) qs[h] = reinterpret_cast<const float*>(a.q->row_ptr(g * a.group + h0 + h, t));
  const bool k16 = a.kc->type == DType::F16;
#ifdef KITE_ATTN_X86
  if (hd % 8 == 0) {
    if (a.kc->type == DType::Q8_0) scores_avx2<LoadQ8>(ng, qs, sc.krows, n, hd, a.scale, sc.s);
    else if (k16) scores_avx2<LoadF16>(ng, qs, sc.krows, n, hd, a.scale, sc.s);
    else scores_avx2<LoadF32>(ng, qs, sc.krows, n, hd, a.scale, sc.s);
    return;
  }
#endif
  mk.attn_scores(qs, ng, sc.krows, k16, n, hd, a.scale, sc.s);
}

// acc[h * hd + i] = sum_j s[h * n + j] * v_j[i] for ng heads.
void accum(const AttnArgs& a, const MatmulKernels& mk, int ng, const Scratch& sc, int64_t n) {
  const DType vt = a.vc->type;
#ifdef KITE_ATTN_X86
  if (a.hd % 8 == 0) {
    if (vt == DType::Q8_0) accum_avx2<LoadQ8>(ng, sc.s, sc.vrows, n, a.hd, sc.acc);
    else if (vt == DType::F16) accum_avx2<LoadF16>(ng, sc.s, sc.vrows, n, a.hd, sc.acc);
    else accum_avx2<LoadF32>(ng, sc.s, sc.vrows, n, a.hd, sc.acc);
    return;
  }
#endif
  mk.attn_accum(sc.s, ng, sc.vrows, vt == DType::F16, n, a.hd, sc.acc);
}

// Keys [j0, j1) of token t, every KV head in turn (a head's slice of a cache row is often not
// a whole number of cache lines; the next head then finds the rest of the line in cache): one
// partial record [m, l, o[hd]] per query head, written to rec (stride hd + 2).
void attend_chunk(const AttnArgs& a, const MatmulKernels& mk, const Scratch& sc, int64_t t, int64_t j0, int64_t j1,
                  float* rec) {
  const int64_t n = j1 - j0, hd = a.hd;
  // Rows of the chunk, block by block through the table.
  const int32_t* blocks = a.table + static_cast<int64_t>(a.seq[t]) * a.max_blocks;
  for (int64_t j = j0; j < j1;) {
    const int64_t b = j / a.bs, in = j % a.bs, run = std::min<int64_t>(a.bs - in, j1 - j);
    const int64_t slot = static_cast<int64_t>(blocks[b]) * a.bs + in;
    const uint8_t* k = a.kc->row_ptr(slot);
    const uint8_t* v = a.vc->row_ptr(slot);
    for (int64_t r = 0; r < run; ++r) sc.krow0[j - j0 + r] = k + r * a.kc->nb[1], sc.vrow0[j - j0 + r] = v + r * a.vc->nb[1];
    j += run;
  }
  for (int64_t g = 0; g < a.n_kv; ++g) {
    for (int64_t j = 0; j < n; ++j) {
      sc.krows[j] = sc.krow0[j] + g * a.k_head;
      sc.vrows[j] = sc.vrow0[j] + g * a.v_head;
    }
    for (int64_t h0 = 0; h0 < a.group; h0 += kMaxGroup) {
      const int ng = static_cast<int>(std::min(kMaxGroup, a.group - h0));
      scores(a, mk, sc, t, g, h0, ng, n);
      float* r = rec + (g * a.group + h0) * (hd + 2);
      for (int h = 0; h < ng; ++h) {
        float* sh = sc.s + h * n;
        const float m = *std::max_element(sh, sh + n);
        r[h * (hd + 2)] = m;
        r[h * (hd + 2) + 1] = mk.exp_sub_sum(sh, n, m);
      }
      accum(a, mk, ng, sc, n);
      for (int h = 0; h < ng; ++h) std::memcpy(r + h * (hd + 2) + 2, sc.acc + h * hd, static_cast<size_t>(hd) * 4);
    }
  }
}

// Merges one query head's n_chunks partial records (chunk c at part + c * stride) in chunk
// order into its output row. Kept out of line: every path merges with the same instructions, so
// results do not depend on how a token's chunks were spread over threads.
__attribute__((noinline)) void merge_one(const float* part, int64_t n_chunks, int64_t stride, int64_t hd, float* o) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < n_chunks; ++c) mx = std::max(mx, part[c * stride]);
  float l = 0.f;
  for (int64_t i = 0; i < hd; ++i) o[i] = 0.f;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const float* r = part + c * stride;
    const float w = std::exp(r[0] - mx);
    l += w * r[1];
    for (int64_t i = 0; i < hd; ++i) o[i] += w * r[2 + i];
  }
  const float inv = 1.f / l;
  for (int64_t i = 0; i < hd; ++i) o[i] *= inv;
}

// All nh query heads of a token: head h's record of chunk c at part + (c * nh + h) * (hd + 2).
void merge_chunks(const float* part, int64_t n_chunks, int64_t nh, int64_t hd, float* out) {
  for (int64_t h = 0; h < nh; ++h) merge_one(part + h * (hd + 2), n_chunks, nh * (hd + 2), hd, out + h * hd);
}

int64_t n_chunks(int64_t nk) { return (nk + kChunk - 1) / kChunk; }

void attention_fast(Tensor* dst, const KernelCtx& c, const MatmulKernels& mk) {
  const AttnArgs a(dst);
  const int64_t n_tok = a.n_tok, n_head = a.n_head, hd = a.hd;
  const int64_t rec_floats = n_head * (hd + 2);  // one chunk's partials of a token

  // Work units: tokens; a token holding more than half a thread's share of the step's keys
  // (one long sequence decoding) is split into (token, chunk) units. Every thread derives the
  // same plan.
  int64_t total = 0, max_nk = 0;
  for (int64_t t = 0; t < n_tok; ++t) total += a.pos[t] + 1, max_nk = std::max<int64_t>(max_nk, a.pos[t] + 1);
  auto split_tok = [&](int64_t t) {
    const int64_t nk = a.pos[t] + 1;
    return c.nth > 1 && nk > kChunk && 2 * nk * c.nth > total;
  };

  // Scratch: unit prefix [n_tok + 1] and partial offsets [n_tok + 1] (int64) | scores | acc |
  // row pointers | local partials.
  auto up16 = [](size_t f) { return (f + 15) / 16 * 16; };
  const size_t f_idx = up16(4 * static_cast<size_t>(n_tok + 1));
  const size_t f_s = up16(static_cast<size_t>(kMaxGroup * kChunk));
  const size_t f_acc = up16(static_cast<size_t>(kMaxGroup * hd));
  const size_t f_ptr = up16(4 * kChunk * sizeof(void*) / sizeof(float));
  const size_t f_part = static_cast<size_t>(n_chunks(max_nk) * rec_floats);
  const size_t f_all = f_idx + f_s + f_acc + f_ptr + f_part + 16;
  std::vector<float>& buf = *c.scratch;
  if (buf.size() < f_all) buf.resize(f_all);
  float* base = buf.data();
  base += (16 - reinterpret_cast<uintptr_t>(base) / 4 % 16) % 16;  // 64-byte aligned
  auto* units = reinterpret_cast<int64_t*>(base);
  int64_t* pbase = units + (n_tok + 1);
  Scratch sc;
  sc.s = base + f_idx;
  sc.acc = sc.s + f_s;
  sc.krows = reinterpret_cast<const uint8_t**>(sc.acc + f_acc);
  sc.vrows = sc.krows + kChunk;
  sc.krow0 = sc.vrows + kChunk;
  sc.vrow0 = sc.krow0 + kChunk;
  sc.part = sc.acc + f_acc + f_ptr;

  units[0] = pbase[0] = 0;
  for (int64_t t = 0; t < n_tok; ++t) {
    const bool sp = split_tok(t);
    const int64_t nch = n_chunks(a.pos[t] + 1);
    units[t + 1] = units[t] + (sp ? nch : 1);
    pbase[t + 1] = pbase[t] + (sp ? nch * rec_floats : 0);
  }
  const bool any_split = pbase[n_tok] > 0;
  float* shared = nullptr;
  if (any_split) {
    const size_t bytes = static_cast<size_t>(pbase[n_tok]) * sizeof(float);
    if (c.ith == 0 && c.shared->size() < bytes) c.shared->resize(bytes);
    c.barrier->wait();
    shared = reinterpret_cast<float*>(c.shared->data());
  }

  for (int64_t u = c.counter->fetch_add(1, std::memory_order_relaxed); u < units[n_tok];
       u = c.counter->fetch_add(1, std::memory_order_relaxed)) {
    const int64_t t = std::upper_bound(units, units + n_tok + 1, u) - units - 1;
    const int64_t nk = a.pos[t] + 1, nch = n_chunks(nk);
    if (split_tok(t)) {
      const int64_t ch = u - units[t];
      attend_chunk(a, mk, sc, t, ch * kChunk, std::min(nk, (ch + 1) * kChunk), shared + pbase[t] + ch * rec_floats);
      continue;
    }
    for (int64_t ch = 0; ch < nch; ++ch)
      attend_chunk(a, mk, sc, t, ch * kChunk, std::min(nk, (ch + 1) * kChunk), sc.part + ch * rec_floats);
    merge_chunks(sc.part, nch, n_head, hd, reinterpret_cast<float*>(dst->row_ptr(t)));
  }
  if (!any_split) return;

  // Merge the spread tokens' partials; their query heads split evenly over the threads.
  c.barrier->wait();
  int64_t n_pairs = 0;
  for (int64_t t = 0; t < n_tok; ++t) n_pairs += split_tok(t) ? n_head : 0;
  int64_t begin, end;
  split(n_pairs, c, &begin, &end);
  for (int64_t t = 0, p = 0; t < n_tok && p < end; ++t) {
    if (!split_tok(t)) continue;
    const int64_t nch = n_chunks(a.pos[t] + 1);
    const int64_t h0 = std::max<int64_t>(begin - p, 0), h1 = std::min<int64_t>(end - p, n_head);
    if (h0 < h1) {
      // One head at a time: the records of head h are strided by rec_floats across chunks.
      for (int64_t h = h0; h < h1; ++h)
        merge_one(shared + pbase[t] + h * (hd + 2), nch, rec_floats, hd,
                  reinterpret_cast<float*>(dst->row_ptr(t)) + h * hd);
    }
    p += n_head;
  }
}

// The scalar reference: one query head at a time, each K/V row converted to f32, online softmax.
void attention_reference(Tensor* dst, const KernelCtx& c) {
  const AttnArgs a(dst);
  const Tensor* q = a.q;
  const int32_t* pos = a.pos;
  const int64_t hd = a.hd, n_head = a.n_head, n_tok = a.n_tok, group = a.group;
  const float scale = a.scale;

  std::vector<float>& buf = *c.scratch;  // acc | k row | v row
  if (buf.size() < static_cast<size_t>(3 * hd)) buf.resize(static_cast<size_t>(3 * hd));
  float* acc = buf.data();
  float* kr = acc + hd;
  float* vr = kr + hd;

  int64_t begin, end;
  split(n_tok * n_head, c, &begin, &end);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t h = r % n_head, t = r / n_head;
    const int64_t g = h / group;
    const auto* qv = reinterpret_cast<const float*>(q->row_ptr(h, t));
    float m = -std::numeric_limits<float>::infinity(), l = 0.f;
    for (int64_t i = 0; i < hd; ++i) acc[i] = 0.f;
    for (int64_t j = 0; j <= pos[t]; ++j) {
      row_to_f32(a.kc->type, a.k_row(t, j, g), kr, hd);
      float s = 0.f;
      for (int64_t i = 0; i < hd; ++i) s += qv[i] * kr[i];
      s *= scale;
      row_to_f32(a.vc->type, a.v_row(t, j, g), vr, hd);
      if (s > m) {
        const float corr = std::exp(m - s);
        l *= corr;
        for (int64_t i = 0; i < hd; ++i) acc[i] *= corr;
        m = s;
      }
      const float e = std::exp(s - m);
      l += e;
      for (int64_t i = 0; i < hd; ++i) acc[i] += e * vr[i];
    }
    auto* out = reinterpret_cast<float*>(dst->row_ptr(t)) + h * hd;
    for (int64_t i = 0; i < hd; ++i) out[i] = acc[i] / l;
  }
}

}  // namespace

void op_attention(Tensor* dst, const KernelCtx& c) {
  const MatmulKernels* mk = active_kernels();
  if (mk != nullptr && fast_type(dst->src[1]->type) && fast_type(dst->src[2]->type)) {
    attention_fast(dst, c, *mk);
    return;
  }
  attention_reference(dst, c);
}

}  // namespace kite::cpu
