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
//
// Prefill runs (a sequence's consecutive positions, kRunMin or more tokens in the step) take
// another loop where the level has packed-key kernels (x86): a work unit is a block of the
// run's tokens and one KV head, each chunk's keys are converted and transposed once for all of
// the block's query rows, and the scores come from MatmulKernels::attn_scores_kt, whose
// arithmetic is attn_scores' own. So a token's bits are the same in a run or alone.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"

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
        max_blocks(dst->src[5]->ne[0]), n_kv(dst->params.i[0]), bs(dst->params.i[1]), window(dst->params.i[2]),
        scale(dst->params.f[0]), softcap(dst->params.f[1]),
        hd(q->ne[0]), n_head(q->ne[1]), n_tok(q->ne[2]), group(n_head / n_kv), k_head(span_bytes(kc, hd)),
        v_head(span_bytes(vc, hd)) {}

  // Bytes of KV head g at position j of token t's sequence, read through the block table.
  const uint8_t* k_row(int64_t t, int64_t j, int64_t g) const { return row(kc, k_head, t, j, g); }
  const uint8_t* v_row(int64_t t, int64_t j, int64_t g) const { return row(vc, v_head, t, j, g); }
  // Token t's first key: 0, or the start of its sliding window.
  int64_t first_key(int64_t t) const { return window > 0 ? std::max<int64_t>(0, pos[t] - window + 1) : 0; }

  const Tensor* q;
  const Tensor* kc;
  const Tensor* vc;
  const int32_t* pos;
  const int32_t* seq;
  const int32_t* table;
  int64_t max_blocks;
  int n_kv, bs, window;
  float scale, softcap;
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
constexpr int64_t kRunMin = 8;  // tokens of a run that take the packed-key loop
constexpr int64_t kRunBlock = 256;  // tokens of a run per work unit, at most
constexpr int64_t kRunPartFloats = int64_t{1} << 20;  // a run unit's partials, at most (else fewer tokens)

// Cache types the fast path reads: F16 and F32 (any head size), Q8_0 (x86 row kernels).
bool fast_type(DType t) {
#if defined(__x86_64__) || defined(_M_X64)
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
  float* part;          // one token's partials: [chunks][n_head][hd + 2], or a run block's
  float* kt;            // a chunk's keys packed for attn_scores_kt: [kChunk * hd], 64-byte aligned
};

// Rows of keys [j0, j1) of token t's sequence (whole cache rows), block by block through the table.
void chunk_rows(const AttnArgs& a, const Scratch& sc, int64_t t, int64_t j0, int64_t j1) {
  const int32_t* blocks = a.table + static_cast<int64_t>(a.seq[t]) * a.max_blocks;
  for (int64_t j = j0; j < j1;) {
    const int64_t b = j / a.bs, in = j % a.bs, run = std::min<int64_t>(a.bs - in, j1 - j);
    const int64_t slot = static_cast<int64_t>(blocks[b]) * a.bs + in;
    const uint8_t* k = a.kc->row_ptr(slot);
    const uint8_t* v = a.vc->row_ptr(slot);
    for (int64_t r = 0; r < run; ++r) {
      sc.krow0[j - j0 + r] = k + r * a.kc->nb[1];
      sc.vrow0[j - j0 + r] = v + r * a.vc->nb[1];
    }
    j += run;
  }
}

// KV head g's slices of the chunk's rows.
void head_rows(const AttnArgs& a, const Scratch& sc, int64_t n, int64_t g) {
  for (int64_t j = 0; j < n; ++j) {
    sc.krows[j] = sc.krow0[j] + g * a.k_head;
    sc.vrows[j] = sc.vrow0[j] + g * a.v_head;
  }
}

// Softmax partials and outputs of query heads h0..h0+ng of token t (KV head g) from their scores
// in sc.s against the chunk's first n keys (sc.vrows): records [m, l, o[hd]] at rec (stride hd + 2).
void finish_heads(const AttnArgs& a, const MatmulKernels& mk, const Scratch& sc, int ng, int64_t n, const float* mx,
                  float* rec) {
  const int64_t hd = a.hd;
  for (int h = 0; h < ng; ++h) {
    rec[h * (hd + 2)] = mx[h];
    rec[h * (hd + 2) + 1] = mk.exp_sub_sum(sc.s + h * n, n, mx[h]);
  }
  mk.attn_accum(sc.s, ng, sc.vrows, a.vc->type, n, hd, sc.acc);
  for (int h = 0; h < ng; ++h) std::memcpy(rec + h * (hd + 2) + 2, sc.acc + h * hd, static_cast<size_t>(hd) * 4);
}

// Soft-capped scores (gemma2): ng rows of n scaled scores and their maxima (tanh is monotonic)
// become softcap * tanh(score / softcap).
void cap_scores(float* s, int ng, int64_t n, float softcap, float* mx) {
  for (int64_t i = 0; i < ng * n; ++i) s[i] = softcap * std::tanh(s[i] / softcap);
  for (int h = 0; h < ng; ++h) mx[h] = softcap * std::tanh(mx[h] / softcap);
}

// Sliding window: the first `off` of n scores of each of ng heads (keys before the token's window)
// masked out, and the maxima taken again over the rest. Both loops mask whole chunks the same
// way (never a shorter row), so a token's sums see its keys in the same lanes either way.
void mask_before(float* s, int ng, int64_t n, int64_t off, float* mx) {
  for (int h = 0; h < ng; ++h) {
    float* r = s + h * n;
    for (int64_t j = 0; j < off; ++j) r[j] = -std::numeric_limits<float>::infinity();
    mx[h] = *std::max_element(r + off, r + n);
  }
}

// Query row pointers of heads h0..h0+ng of token t, KV head g.
void query_rows(const AttnArgs& a, int64_t t, int64_t g, int64_t h0, int ng, const float** qs) {
  for (int h = 0; h < ng; ++h) qs[h] = reinterpret_cast<const float*>(a.q->row_ptr(g * a.group + h0 + h, t));
}

// Keys [j0, j1) of token t, every KV head in turn (a head's slice of a cache row is often not
// a whole number of cache lines; the next head then finds the rest of the line in cache): one
// partial record [m, l, o[hd]] per query head, written to rec (stride hd + 2).
void attend_chunk(const AttnArgs& a, const MatmulKernels& mk, const Scratch& sc, int64_t t, int64_t j0, int64_t j1,
                  float* rec) {
  const int64_t n = j1 - j0, hd = a.hd, lo = a.first_key(t);  // (j1 > lo: a chunk holding some of its keys)
  chunk_rows(a, sc, t, j0, j1);
  for (int64_t g = 0; g < a.n_kv; ++g) {
    head_rows(a, sc, n, g);
    for (int64_t h0 = 0; h0 < a.group; h0 += kMaxGroup) {
      const int ng = static_cast<int>(std::min(kMaxGroup, a.group - h0));
      const float* qs[kMaxGroup];
      float mx[kMaxGroup];
      query_rows(a, t, g, h0, ng, qs);
      mk.attn_scores(qs, ng, sc.krows, a.kc->type, n, hd, a.scale, sc.s, mx);
      if (a.softcap > 0.f) cap_scores(sc.s, ng, n, a.softcap, mx);
      if (lo > j0) mask_before(sc.s, ng, n, lo - j0, mx);
      finish_heads(a, mk, sc, ng, n, mx, rec + (g * a.group + h0) * (hd + 2));
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

// Token t's first chunk with any of its keys (0 but for a sliding window): its partials and their
// merge start there.
int64_t first_chunk(const AttnArgs& a, int64_t t) { return a.first_key(t) / kChunk; }

// Tokens [tb, te) of one run (consecutive positions of a sequence), KV head g: each chunk's keys
// packed once for every query row of the block, partials of token t, chunk c, head h at
// part + (((t - tb) * nch + c) * group + h) * (hd + 2), merged per head like merge_chunks.
void attend_run(const AttnArgs& a, const MatmulKernels& mk, const Scratch& sc, int64_t tb, int64_t te, int64_t g,
                Tensor* dst) {
  const int64_t hd = a.hd, group = a.group, nk = a.pos[te - 1] + 1, nch = n_chunks(nk);
  for (int64_t c = first_chunk(a, tb); c < nch; ++c) {  // (the first token's window starts first)
    const int64_t j0 = c * kChunk, j1 = std::min(nk, j0 + kChunk);
    chunk_rows(a, sc, te - 1, j0, j1);
    head_rows(a, sc, j1 - j0, g);
    mk.attn_pack_kt(sc.krows, a.kc->type, j1 - j0, hd, sc.kt);
    for (int64_t t = tb; t < te; ++t) {
      if (a.pos[t] < j0) continue;  // (its keys end before this chunk)
      const int64_t lo = a.first_key(t);
      if (j1 <= lo) continue;  // (before its window: not merged)
      const int64_t n = std::min<int64_t>(a.pos[t] + 1, j1) - j0;
      for (int64_t h0 = 0; h0 < group; h0 += kMaxGroup) {
        const int ng = static_cast<int>(std::min(kMaxGroup, group - h0));
        const float* qs[kMaxGroup];
        float mx[kMaxGroup];
        query_rows(a, t, g, h0, ng, qs);
        mk.attn_scores_kt(qs, ng, sc.kt, n, hd, a.scale, sc.s, mx);
        if (a.softcap > 0.f) cap_scores(sc.s, ng, n, a.softcap, mx);
        if (lo > j0) mask_before(sc.s, ng, n, lo - j0, mx);
        finish_heads(a, mk, sc, ng, n, mx, sc.part + (((t - tb) * nch + c) * group + h0) * (hd + 2));
      }
    }
  }
  for (int64_t t = tb; t < te; ++t) {
    auto* out = reinterpret_cast<float*>(dst->row_ptr(t));
    const int64_t c0 = first_chunk(a, t);
    for (int64_t h = 0; h < group; ++h)
      merge_one(sc.part + (((t - tb) * nch + c0) * group + h) * (hd + 2), n_chunks(a.pos[t] + 1) - c0,
                group * (hd + 2), hd, out + (g * group + h) * hd);
  }
}

void attention_fast(Tensor* dst, const KernelCtx& c, const MatmulKernels& mk) {
  const AttnArgs a(dst);
  const int64_t n_tok = a.n_tok, n_head = a.n_head, hd = a.hd;
  const int64_t rec_floats = n_head * (hd + 2);  // one chunk's partials of a token

  // Scratch: int64 [n_tok + 1] token unit prefix, [n_tok + 1] partial offsets, [2 (n_tok + 1)]
  // run blocks (first, end), [n_tok + 1] in-run flags | scores | acc | row pointers | packed keys |
  // local partials.
  auto up16 = [](size_t f) { return (f + 15) / 16 * 16; };
  const bool packed = mk.attn_scores_kt != nullptr && hd % 8 == 0;
  int64_t max_nk = 0;
  for (int64_t t = 0; t < n_tok; ++t) max_nk = std::max<int64_t>(max_nk, a.pos[t] + 1);
  // Tokens per run block: kRunBlock, fewer where their partials would pass kRunPartFloats.
  const int64_t max_block = std::clamp<int64_t>(kRunPartFloats / (n_chunks(max_nk) * a.group * (hd + 2)), 1, kRunBlock);
  const size_t f_idx = up16(10 * static_cast<size_t>(n_tok + 1));
  const size_t f_s = up16(static_cast<size_t>(kMaxGroup * kChunk));
  const size_t f_acc = up16(static_cast<size_t>(kMaxGroup * hd));
  const size_t f_ptr = up16(4 * kChunk * sizeof(void*) / sizeof(float));
  const size_t f_kt = packed ? static_cast<size_t>(kChunk * hd) : 0;
  const size_t f_part = static_cast<size_t>(std::max(n_chunks(max_nk) * rec_floats,
                                                     packed ? max_block * n_chunks(max_nk) * a.group * (hd + 2) : 0));
  const size_t f_all = f_idx + f_s + f_acc + f_ptr + f_kt + f_part + 16;
  std::vector<float>& buf = *c.scratch;
  if (buf.size() < f_all) buf.resize(f_all);
  float* base = buf.data();
  base += (16 - reinterpret_cast<uintptr_t>(base) / 4 % 16) % 16;  // 64-byte aligned
  auto* units = reinterpret_cast<int64_t*>(base);
  int64_t* pbase = units + (n_tok + 1);
  int64_t* blocks = pbase + (n_tok + 1);
  int64_t* in_run = blocks + 2 * (n_tok + 1);
  Scratch sc;
  sc.s = base + f_idx;
  sc.acc = sc.s + f_s;
  sc.krows = reinterpret_cast<const uint8_t**>(sc.acc + f_acc);
  sc.vrows = sc.krows + kChunk;
  sc.krow0 = sc.vrows + kChunk;
  sc.vrow0 = sc.krow0 + kChunk;
  sc.kt = sc.acc + f_acc + f_ptr;
  sc.part = sc.kt + f_kt;

  // Runs, in blocks of equal size: as large as allowed (each block packs every chunk's keys
  // once), as long as the run still gives about four units a thread.
  int64_t n_blocks = 0;
  std::fill(in_run, in_run + n_tok, 0);
  if (packed) {
    for (int64_t t = 0; t < n_tok;) {
      int64_t e = t + 1;
      while (e < n_tok && a.seq[e] == a.seq[t] && a.pos[e] == a.pos[e - 1] + 1) ++e;
      const int64_t len = e - t;
      if (len >= kRunMin) {
        const int64_t want = std::min(max_block, std::max(kRunMin, len * a.n_kv / (4 * c.nth)));
        const int64_t nb = (len + want - 1) / want, per = (len + nb - 1) / nb;
        for (int64_t b = t; b < e; b += per) {
          blocks[2 * n_blocks] = b, blocks[2 * n_blocks + 1] = std::min(e, b + per), ++n_blocks;
        }
        std::fill(in_run + t, in_run + e, 1);
      }
      t = e;
    }
  }

  // Work units: run blocks x KV heads first (the largest), then the other tokens; a token holding
  // more than half a thread's share of the step's keys (one long sequence decoding) is split into
  // (token, chunk) units. Every thread derives the same plan. A token's keys and partials start
  // at its first chunk (first_chunk).
  auto keys = [&](int64_t t) { return a.pos[t] + 1 - first_chunk(a, t) * kChunk; };
  int64_t total = 0;
  for (int64_t t = 0; t < n_tok; ++t) total += keys(t);
  auto split_tok = [&](int64_t t) {
    const int64_t nk = keys(t);
    return !in_run[t] && c.nth > 1 && nk > kChunk && 2 * nk * c.nth > total;
  };
  units[0] = pbase[0] = 0;
  for (int64_t t = 0; t < n_tok; ++t) {
    const bool sp = split_tok(t);
    const int64_t nch = n_chunks(a.pos[t] + 1) - first_chunk(a, t);
    units[t + 1] = units[t] + (in_run[t] ? 0 : sp ? nch : 1);
    pbase[t + 1] = pbase[t] + (sp ? nch * rec_floats : 0);
  }
  const int64_t run_units = n_blocks * a.n_kv;
  const bool any_split = pbase[n_tok] > 0;
  float* shared = nullptr;
  if (any_split) {
    const size_t bytes = static_cast<size_t>(pbase[n_tok]) * sizeof(float);
    if (c.ith == 0 && c.shared->size() < bytes) c.shared->resize(bytes);
    c.barrier->wait();
    shared = reinterpret_cast<float*>(c.shared->data());
  }

  for (int64_t v = c.counter->fetch_add(1, std::memory_order_relaxed); v < run_units + units[n_tok];
       v = c.counter->fetch_add(1, std::memory_order_relaxed)) {
    if (v < run_units) {
      const int64_t b = v / a.n_kv;
      attend_run(a, mk, sc, blocks[2 * b], blocks[2 * b + 1], v % a.n_kv, dst);
      continue;
    }
    const int64_t u = v - run_units;
    const int64_t t = std::upper_bound(units, units + n_tok + 1, u) - units - 1;
    const int64_t nk = a.pos[t] + 1, c0 = first_chunk(a, t), nch = n_chunks(nk);
    if (split_tok(t)) {
      const int64_t i = u - units[t], ch = c0 + i;
      attend_chunk(a, mk, sc, t, ch * kChunk, std::min(nk, (ch + 1) * kChunk), shared + pbase[t] + i * rec_floats);
      continue;
    }
    for (int64_t ch = c0; ch < nch; ++ch)
      attend_chunk(a, mk, sc, t, ch * kChunk, std::min(nk, (ch + 1) * kChunk), sc.part + (ch - c0) * rec_floats);
    merge_chunks(sc.part, nch - c0, n_head, hd, reinterpret_cast<float*>(dst->row_ptr(t)));
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
    const int64_t nch = n_chunks(a.pos[t] + 1) - first_chunk(a, t);
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
    for (int64_t j = a.first_key(t); j <= pos[t]; ++j) {
      row_to_f32(a.kc->type, a.k_row(t, j, g), kr, hd);
      float s = 0.f;
      for (int64_t i = 0; i < hd; ++i) s += qv[i] * kr[i];
      s *= scale;
      if (a.softcap > 0.f) s = a.softcap * std::tanh(s / a.softcap);
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
