// Op conformance for attention over the paged KV cache: F16/F32/Q8_0 caches, GQA, scattered
// and shared blocks, mixed decode and prefill rows, and results independent of the batch and
// of the thread split (see test_ops.cpp for the method).
#include "tests/ops_test_util.h"

namespace kite {
namespace {

using namespace ops_test;

// A continuous-batching step over a paged cache: several sequences with scattered,
// non-monotonic block tables (the first block shared by two of them, as the prefix cache
// leaves it), each contributing decode tokens or a prefill chunk at positions not starting at 0.
struct PagedBatch {
  int64_t hd, nh, nkv, bs, maxb, nslots;
  std::vector<int32_t> table, pos, seq, slots;  // table [maxb, n_seqs]; slots: where each token's K/V goes
  int32_t window = 0;  // AttentionParams::window
  float softcap = 0.f;  // AttentionParams::softcap
  int64_t n_tok() const { return static_cast<int64_t>(pos.size()); }
  int64_t n_seqs() const { return static_cast<int64_t>(table.size()) / maxb; }
  int64_t slot(int64_t s, int64_t p) const { return int64_t{table[s * maxb + p / bs]} * bs + p % bs; }
};

// seqs[i] = {first position, tokens}: a prefill chunk (or one decode token) of sequence i.
PagedBatch make_batch(int64_t hd, int64_t nh, int64_t nkv, const std::vector<std::pair<int, int>>& seqs,
                      uint32_t seed) {
  PagedBatch b{hd, nh, nkv, 16, 0, 0, {}, {}, {}, {}};
  int64_t nblocks = 0;
  for (auto [p0, n] : seqs) {
    b.maxb = std::max<int64_t>(b.maxb, (p0 + n + b.bs - 1) / b.bs);
    nblocks += (p0 + n + b.bs - 1) / b.bs;
  }
  nblocks += 3;  // a few blocks nobody uses
  std::vector<int32_t> phys(static_cast<size_t>(nblocks));
  for (size_t i = 0; i < phys.size(); ++i) phys[i] = static_cast<int32_t>(i);
  std::shuffle(phys.begin(), phys.end(), std::mt19937(seed));
  b.table.assign(static_cast<size_t>(b.maxb * static_cast<int64_t>(seqs.size())), -1);
  size_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t need = (seqs[s].first + seqs[s].second + b.bs - 1) / b.bs;
    for (int64_t k = 0; k < need; ++k) b.table[s * b.maxb + k] = phys[next++];
  }
  // Sequences 1 and 2 share their first block (a cached prefix; neither writes into it).
  if (seqs.size() >= 3 && seqs[1].first >= b.bs && seqs[2].first >= b.bs) b.table[2 * b.maxb] = b.table[b.maxb];
  b.nslots = nblocks * b.bs;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int i = 0; i < seqs[s].second; ++i) {
      b.pos.push_back(seqs[s].first + i);
      b.seq.push_back(static_cast<int32_t>(s));
      b.slots.push_back(static_cast<int32_t>(b.slot(static_cast<int64_t>(s), seqs[s].first + i)));
    }
  return b;
}

// Double-precision attention of q over the decoded caches kd/vd ([hd * nkv] per slot).
std::vector<double> attention_ref(const PagedBatch& b, const std::vector<float>& q, const std::vector<float>& kd,
                                  const std::vector<float>& vd, double scale) {
  const int64_t hd = b.hd, nh = b.nh, nkv = b.nkv;
  std::vector<double> ref(static_cast<size_t>(hd * nh * b.n_tok()));
  for (int64_t ti = 0; ti < b.n_tok(); ++ti)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kvh = h / (nh / nkv);
      std::vector<double> s;
      const int64_t lo = b.window > 0 ? std::max<int64_t>(0, b.pos[ti] - b.window + 1) : 0;
      for (int64_t j = lo; j <= b.pos[ti]; ++j) {
        const int64_t slot = b.slot(b.seq[ti], j);
        double d = 0;
        for (int64_t i = 0; i < hd; ++i)
          d += static_cast<double>(q[(ti * nh + h) * hd + i]) * kd[(slot * nkv + kvh) * hd + i];
        s.push_back(b.softcap > 0 ? b.softcap * std::tanh(d * scale / b.softcap) : d * scale);
      }
      double mx = -INFINITY, sum = 0;
      for (double v : s) mx = std::max(mx, v);
      for (double& v : s) sum += (v = std::exp(v - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t j = lo; j <= b.pos[ti]; ++j)
          acc += s[j - lo] / sum * vd[(b.slot(b.seq[ti], j) * nkv + kvh) * hd + i];
        ref[(ti * nh + h) * hd + i] = acc;
      }
    }
  return ref;
}

TEST_CASE("ops: attention over a paged F16 and F32 cache with GQA") {
  const int64_t hd = 64, nh = 4, nkv = 2, bs = 4, nblocks = 8, nslots = bs * nblocks, maxb = 4;
  // Two sequences: seq 0 owns blocks {2, 0, 5, 7}, seq 1 owns {1, 3, 4, 6}.
  const std::vector<int32_t> table = {2, 0, 5, 7, 1, 3, 4, 6};  // [max_blocks=4, n_seqs=2]
  const std::vector<int32_t> pos = {13, 2, 15, 9}, seq = {0, 1, 0, 1};
  const int64_t nt = static_cast<int64_t>(pos.size());
  const std::vector<float> q = randn(static_cast<size_t>(hd * nh * nt), 41);
  const std::vector<float> kf = randn(static_cast<size_t>(hd * nkv * nslots), 42);
  const std::vector<float> vf = randn(static_cast<size_t>(hd * nkv * nslots), 43);
  const float scale = 1.f / 8.f;
  for (DType t : {DType::F16, DType::F32}) {
    const std::vector<uint8_t> kb = encode(t, kf, nslots, hd * nkv), vb = encode(t, vf, nslots, hd * nkv);
    const std::vector<float> kd = decode(t, kb, hd * nkv * nslots), vd = decode(t, vb, hd * nkv * nslots);
    const PagedBatch b{hd, nh, nkv, bs, maxb, nslots, table, pos, seq, {}};
    const std::vector<double> ref = attention_ref(b, q, kd, vd, scale);
    check_op("attention", ref, 1e-10, [&](Backend& be) {
      Graph g;
      Tensor* tq = g.input(DType::F32, {hd, nh, nt}, "q");
      Tensor* tk = g.input(t, {hd * nkv, nslots}, "k");
      Tensor* tv = g.input(t, {hd * nkv, nslots}, "v");
      Tensor* tp = g.input(DType::I32, {nt}, "pos");
      Tensor* ts = g.input(DType::I32, {nt}, "seq");
      Tensor* tt = g.input(DType::I32, {maxb, 2}, "table");
      AttentionParams ap;
      ap.n_kv_head = static_cast<int32_t>(nkv);
      ap.block_size = static_cast<int32_t>(bs);
      ap.scale = scale;
      return run_graph(be, g, g.attention(tq, tk, tv, tp, ts, tt, ap),
                       {{tq, bytes_of(q)}, {tk, kb}, {tv, vb}, {tp, bytes_of_i32(pos)}, {ts, bytes_of_i32(seq)},
                        {tt, bytes_of_i32(table)}});
    });
  }
}


// kv_write of the batch's new K/V rows into caches of types kt/vt, then attention over them.
std::vector<float> run_paged_attention(Backend& be, const PagedBatch& b, DType kt, DType vt, const std::vector<float>& q,
                                       const std::vector<uint8_t>& kb, const std::vector<uint8_t>& vb,
                                       const std::vector<float>& knew, const std::vector<float>& vnew, float scale) {
  const int64_t row = b.hd * b.nkv, nt = b.n_tok();
  Graph g;
  Tensor* tq = g.input(DType::F32, {b.hd, b.nh, nt}, "q");
  Tensor* tk = g.input(kt, {row, b.nslots}, "k");
  Tensor* tv = g.input(vt, {row, b.nslots}, "v");
  Tensor* tkn = g.input(DType::F32, {row, nt}, "k_new");
  Tensor* tvn = g.input(DType::F32, {row, nt}, "v_new");
  Tensor* tsl = g.input(DType::I32, {nt}, "slots");
  Tensor* tp = g.input(DType::I32, {nt}, "pos");
  Tensor* ts = g.input(DType::I32, {nt}, "seq");
  Tensor* tt = g.input(DType::I32, {b.maxb, b.n_seqs()}, "table");
  AttentionParams ap;
  ap.n_kv_head = static_cast<int32_t>(b.nkv);
  ap.block_size = static_cast<int32_t>(b.bs);
  ap.scale = scale;
  ap.window = b.window;
  ap.softcap = b.softcap;
  Tensor* kw = g.kv_write(tk, tkn, tsl);
  Tensor* vw = g.kv_write(tv, tvn, tsl);
  return run_graph(be, g, g.attention(tq, kw, vw, tp, ts, tt, ap),
                   {{tq, bytes_of(q)}, {tk, kb}, {tv, vb}, {tkn, bytes_of(knew)}, {tvn, bytes_of(vnew)},
                    {tsl, bytes_of_i32(b.slots)}, {tp, bytes_of_i32(b.pos)}, {ts, bytes_of_i32(b.seq)},
                    {tt, bytes_of_i32(b.table)}});
}

// Random queries, caches of kt/vt and new K/V rows for batch b, with the double reference on the
// decoded caches (with the new rows as the reference quantizer stores them).
struct AttentionCase {
  std::vector<float> q, knew, vnew;
  std::vector<uint8_t> kb, vb;
  std::vector<double> ref;
  float scale;
};

AttentionCase make_case(const PagedBatch& b, DType kt, DType vt, uint32_t seed) {
  const int64_t row = b.hd * b.nkv, nt = b.n_tok();
  AttentionCase c;
  c.scale = 1.f / std::sqrt(static_cast<float>(b.hd));
  c.q = randn(static_cast<size_t>(b.hd * b.nh * nt), seed);
  const std::vector<float> kf = randn(static_cast<size_t>(row * b.nslots), seed + 1);
  const std::vector<float> vf = randn(static_cast<size_t>(row * b.nslots), seed + 2);
  c.knew = randn(static_cast<size_t>(row * nt), seed + 3);
  c.vnew = randn(static_cast<size_t>(row * nt), seed + 4);
  c.kb = encode(kt, kf, b.nslots, row);
  c.vb = encode(vt, vf, b.nslots, row);
  std::vector<float> kd = decode(kt, c.kb, row * b.nslots), vd = decode(vt, c.vb, row * b.nslots);
  const std::vector<float> knd = decode(kt, encode(kt, c.knew, nt, row), row * nt);
  const std::vector<float> vnd = decode(vt, encode(vt, c.vnew, nt, row), row * nt);
  for (int64_t t = 0; t < nt; ++t) {
    std::copy_n(knd.begin() + t * row, row, kd.begin() + b.slots[t] * row);
    std::copy_n(vnd.begin() + t * row, row, vd.begin() + b.slots[t] * row);
  }
  c.ref = attention_ref(b, c.q, kd, vd, c.scale);
  return c;
}

// Runs the batch with caches of kt/vt through every config and checks it against the double
// reference. Returns the worst NMSE seen.
double check_paged_attention(const PagedBatch& b, DType kt, DType vt, uint32_t seed) {
  const AttentionCase ac = make_case(b, kt, vt, seed);
  // Every path computes in f32 from the decoded cache values (Q8_0 rows are dequantized, the
  // queries are not quantized), so all of them are close to exact; but CUDA's tensor-core kernel
  // (long prefill runs), which rounds queries and probabilities to half: there the bound is half
  // precision's, and the batch runs again on the CUDA-core kernel alone to the exact bound.
  double worst = 0;
  for_each_config([&](const Config& c) {
    auto run = [&] {
      return run_paged_attention(*c.backend, b, kt, vt, ac.q, ac.kb, ac.vb, ac.knew, ac.vnew, ac.scale);
    };
    const double e = nmse(run(), ac.ref);
    INFO("attention on ", c.label, " k ", quant::find_traits(kt)->name, " v ", quant::find_traits(vt)->name,
         " hd=", b.hd, " nh=", b.nh, " nkv=", b.nkv, " n_tok=", b.n_tok(), " window=", b.window,
         " softcap=", b.softcap);
    if (c.label == "cuda" && e >= 1e-10) {
      CHECK(e < 2e-6);
      const ScopedEnv cores("KITE_CUDA_ATTN_TC", "0");
      CHECK(nmse(run(), ac.ref) < 1e-10);
    } else {
      CHECK(e < 1e-10);
    }
    worst = std::max(worst, e);
  });
  return worst;
}

// Rows `rows` (each `width` elements) of v.
template <class T>
std::vector<T> pick_rows(const std::vector<T>& v, const std::vector<int64_t>& rows, int64_t width) {
  std::vector<T> out;
  for (int64_t r : rows) out.insert(out.end(), v.begin() + r * width, v.begin() + (r + 1) * width);
  return out;
}

TEST_CASE("ops: kv_write into a Q8_0 cache") {
  const int64_t row = 96 * 3, slots = 21;  // three KV heads of 96 (3 blocks each)
  const std::vector<int32_t> where = {17, 3, 20, 8, 0};
  const int64_t n = static_cast<int64_t>(where.size());
  const std::vector<float> rows = randn(static_cast<size_t>(row * n), 61, 3.f);
  const std::vector<float> old = randn(static_cast<size_t>(row * slots), 62);
  const std::vector<uint8_t> cache0 = encode(DType::Q8_0, old, slots, row);
  std::vector<float> expect = decode(DType::Q8_0, cache0, row * slots);
  const std::vector<float> rd = decode(DType::Q8_0, encode(DType::Q8_0, rows, n, row), row * n);
  for (int64_t r = 0; r < n; ++r) std::copy_n(rd.begin() + r * row, row, expect.begin() + where[r] * row);
  for_each_config([&](const Config& c) {
    Graph g;
    Tensor* cache = g.input(DType::Q8_0, {row, slots}, "cache");
    Tensor* tr = g.input(DType::F32, {row, n}, "rows");
    Tensor* ts = g.input(DType::I32, {n}, "slots");
    Tensor* out = g.kv_write(cache, tr, ts);
    REQUIRE(c.backend->supports(*out));
    const std::vector<float> got =
        run_graph(*c.backend, g, out, {{cache, cache0}, {tr, bytes_of(rows)}, {ts, bytes_of_i32(where)}});
    INFO("kv_write on ", c.label);
    // The reference quantizer's bytes exactly: untouched slots keep theirs, written ones match.
    CHECK(got == expect);
  });
  // A row that is not whole Q8_0 blocks is refused rather than miswritten.
  auto be = create_backend("cpu", BackendOptions{});
  REQUIRE(be.ok());
  Graph g;
  Tensor* bad = g.kv_write(g.input(DType::Q8_0, {40, 4}, "cache"), g.input(DType::F32, {40, 1}, "rows"),
                           g.input(DType::I32, {1}, "slots"));
  CHECK_FALSE((*be)->supports(*bad));
}

TEST_CASE("ops: attention over a Q8_0 cache, mixed decode and prefill rows, scattered blocks") {
  // Decode tokens of long sequences (several kChunk-sized chunks), a prefill chunk at positions
  // 20..24, decode tokens sharing a prefix block; GQA groups of 4 and 6. Head sizes 64 and 96
  // take the 512-bit kernels at the AVX-512 level (four keys a step, 64 or 32 outputs a pass);
  // 40 the 256-bit ones there too, 20 their scalar tail; group 7 splits into passes of 4 and 3.
  const std::vector<std::pair<int, int>> seqs = {{700, 1}, {20, 5}, {40, 1}, {1100, 1}, {3, 2}};
  const PagedBatch llama = make_batch(64, 8, 2, seqs, 71);
  const PagedBatch odd = make_batch(96, 12, 2, seqs, 72);
  check_paged_attention(llama, DType::Q8_0, DType::Q8_0, 80);
  check_paged_attention(odd, DType::Q8_0, DType::Q8_0, 81);
  check_paged_attention(odd, DType::F16, DType::Q8_0, 82);
  check_paged_attention(llama, DType::Q8_0, DType::F16, 83);
  check_paged_attention(odd, DType::BF16, DType::BF16, 84);
  check_paged_attention(llama, DType::F32, DType::F16, 85);
  check_paged_attention(llama, DType::F16, DType::F16, 86);
  const PagedBatch narrow = make_batch(40, 6, 2, seqs, 73);
  const PagedBatch tiny = make_batch(20, 7, 1, seqs, 74);
  const PagedBatch group7 = make_batch(128, 14, 2, seqs, 75);
  check_paged_attention(narrow, DType::F16, DType::F32, 87);
  check_paged_attention(tiny, DType::F32, DType::F16, 88);
  check_paged_attention(group7, DType::Q8_0, DType::F16, 89);
}

TEST_CASE("ops: sliding-window attention (gemma) over paged caches, windows shorter and longer than a chunk") {
  // Each row sees its last `window` positions only: decode rows of long sequences (their window
  // starts inside a 512-key chunk, or chunks before it hold none of its keys), prefill runs
  // crossing a chunk boundary, rows shorter than the window; a window of 1 (the row's own key).
  const std::vector<std::pair<int, int>> seqs = {{700, 1}, {490, 40}, {20, 5}, {1100, 1}, {0, 70}};
  for (int32_t window : {1, 37, 100, 512, 600}) {
    PagedBatch b = make_batch(64, 8, 2, seqs, 140);
    b.window = window;
    check_paged_attention(b, DType::F16, DType::F16, 141);
    check_paged_attention(b, DType::Q8_0, DType::Q8_0, 142);
  }
  PagedBatch b = make_batch(128, 14, 2, seqs, 143);
  b.window = 77;
  check_paged_attention(b, DType::F32, DType::F16, 144);
  // gemma2's soft-capped scores, with and without a window.
  for (int32_t window : {0, 100}) {
    PagedBatch c = make_batch(64, 8, 2, seqs, 145);
    c.window = window;
    c.softcap = 0.75f;
    check_paged_attention(c, DType::F16, DType::F16, 146);
    check_paged_attention(c, DType::Q8_0, DType::F32, 147);
  }
}

TEST_CASE("ops: attention of one long sequence spread over threads, batch-independent results") {
  // One KV head and group 12 (more than the 8 heads scored together): a single decode token's
  // chunks are spread over the threads; its result must equal, bit for bit, the one it gets
  // inside a larger batch (where it is not spread), for every cache type; with a sliding window
  // too (its chunks then start at the window's).
  for (const int32_t window : {0, 700})
  for (DType t : {DType::F16, DType::Q8_0, DType::F32}) {
    PagedBatch alone = make_batch(64, 12, 1, {{1300, 1}}, 91);
    alone.window = window;
    check_paged_attention(alone, t, t, 92);
    PagedBatch mixed = make_batch(64, 12, 1, {{1300, 1}, {600, 40}, {9, 1}}, 93);
    mixed.window = window;
    mixed.table.assign(mixed.table.size(), 0);
    // Same blocks for sequence 0 as `alone`; the others get blocks beyond them.
    const int64_t nb0 = alone.maxb;
    for (int64_t k = 0; k < nb0; ++k) mixed.table[k] = alone.table[k];
    int32_t next = static_cast<int32_t>(alone.nslots / alone.bs);
    for (int64_t s = 1; s < mixed.n_seqs(); ++s)
      for (int64_t k = 0; k < mixed.maxb; ++k) mixed.table[s * mixed.maxb + k] = next++;
    mixed.nslots = int64_t{next} * mixed.bs;
    for (int64_t i = 0; i < mixed.n_tok(); ++i) mixed.slots[i] = static_cast<int32_t>(mixed.slot(mixed.seq[i], mixed.pos[i]));
    const int64_t row = 64;
    const std::vector<float> q1 = randn(64 * 12, 94), kf = randn(static_cast<size_t>(row * mixed.nslots), 95),
                             vf = randn(static_cast<size_t>(row * mixed.nslots), 96);
    std::vector<float> qm = randn(static_cast<size_t>(64 * 12 * mixed.n_tok()), 97);
    std::copy(q1.begin(), q1.end(), qm.begin());
    const std::vector<float> kn = randn(static_cast<size_t>(row * mixed.n_tok()), 98),
                             vn = randn(static_cast<size_t>(row * mixed.n_tok()), 99);
    const std::vector<uint8_t> kb = encode(t, kf, mixed.nslots, row), vb = encode(t, vf, mixed.nslots, row);
    const size_t rb = quant::row_size(t, row).value();
    const std::vector<uint8_t> kb1(kb.begin(), kb.begin() + static_cast<std::ptrdiff_t>(rb * alone.nslots));
    const std::vector<uint8_t> vb1(vb.begin(), vb.begin() + static_cast<std::ptrdiff_t>(rb * alone.nslots));
    for_each_config([&](const Config& c) {
      const std::vector<float> one = run_paged_attention(*c.backend, alone, t, t, q1, kb1, vb1,
                                                         std::vector<float>(kn.begin(), kn.begin() + row),
                                                         std::vector<float>(vn.begin(), vn.begin() + row), 0.125f);
      const std::vector<float> many = run_paged_attention(*c.backend, mixed, t, t, qm, kb, vb, kn, vn, 0.125f);
      INFO("attention on ", c.label, " ", quant::find_traits(t)->name);
      CHECK(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)) == 0);
    });
  }
}

TEST_CASE("ops: packed-key scores of prefill runs equal the row kernels' bit for bit") {
  // attn_scores_kt (x86 levels) must reproduce attn_scores exactly: a token's output may not
  // depend on whether it was scored in a prefill run or alone. Head sizes 8..256 (16-lane and
  // 8-lane panels at the AVX-512 level), 1..8 heads, chunks that end mid-panel, every cache type.
  [[maybe_unused]] bool ran = false;  // (checked on x86 only)
  for (SimdLevel l : cpu::supported_simd_levels()) {
    const cpu::MatmulKernels* mk = cpu::matmul_kernels_for(l);
    if (mk == nullptr || mk->attn_scores_kt == nullptr) continue;
    ran = true;
    for (int64_t hd : {32, 64, 128, 256, 16, 8, 40, 72})
      for (DType t : {DType::F16, DType::F32, DType::Q8_0}) {
        if (t == DType::Q8_0 && hd % 32 != 0) continue;
        const int64_t n = hd == 64 ? 512 : 37 + hd % 7;
        const std::vector<float> kf = randn(static_cast<size_t>(n * hd), 500 + static_cast<uint32_t>(hd));
        const std::vector<uint8_t> kb = encode(t, kf, n, hd);
        const size_t rb = quant::row_size(t, hd).value();
        std::vector<const uint8_t*> rows;
        for (int64_t j = 0; j < n; ++j) rows.push_back(kb.data() + static_cast<size_t>(j) * rb);
        const std::vector<float> qf = randn(static_cast<size_t>(8 * hd), 600);
        std::vector<float> ktb(static_cast<size_t>((n + 15) / 16 * 16 * hd + 16));
        float* kt = ktb.data() + (16 - reinterpret_cast<uintptr_t>(ktb.data()) / 4 % 16) % 16;  // 64-byte aligned
        mk->attn_pack_kt(rows.data(), t, n, hd, kt);
        for (int ng = 1; ng <= 8; ++ng)
          for (int64_t nk : {n, n - 5, int64_t{1}, int64_t{16}}) {
            const float* q[8];
            for (int h = 0; h < ng; ++h) q[h] = qf.data() + h * hd;
            std::vector<float> s1(static_cast<size_t>(8 * nk)), s2(s1.size()), m1(8), m2(8);
            mk->attn_scores(q, ng, rows.data(), t, nk, hd, 0.125f, s1.data(), m1.data());
            mk->attn_scores_kt(q, ng, kt, nk, hd, 0.125f, s2.data(), m2.data());
            INFO(cpu::simd_level_name(l), " ", quant::find_traits(t)->name, " hd=", hd, " heads=", ng, " keys=", nk);
            CHECK(std::memcmp(s1.data(), s2.data(), static_cast<size_t>(ng * nk) * 4) == 0);
            CHECK(std::memcmp(m1.data(), m2.data(), static_cast<size_t>(ng) * 4) == 0);
          }
      }
  }
#if defined(__x86_64__)
  CHECK(ran);
#endif
}

TEST_CASE("ops: attention rows of a prefill run equal the same rows computed alone, bit for bit") {
  // A 40-token run crossing the 512-key chunk boundary, a 70-token run from position 0, a run too
  // short for the packed-key loop, a decode token: each row alone (a one-token batch takes the
  // row kernels) gives the bits it got in the batch, on every level and thread count.
  // With a sliding window too (its start falls inside the run's chunks).
  for (int32_t window : {0, 100})
  for (auto [kt, vt] : {std::pair{DType::F16, DType::F16}, std::pair{DType::Q8_0, DType::Q8_0}}) {
    PagedBatch b = make_batch(64, 8, 2, {{490, 40}, {0, 70}, {30, 5}, {800, 1}}, 120);
    b.window = window;
    b.softcap = window > 0 ? 0.75f : 0.f;  // (and soft-capped scores)
    const AttentionCase ac = make_case(b, kt, vt, 130);
    const int64_t row = b.hd * b.nkv, qrow = b.hd * b.nh;
    for_each_config([&](const Config& c) {
      if (!c.cpu) return;  // (GPU backends route runs to other kernels: tested in their own files)
      const std::vector<float> got =
          run_paged_attention(*c.backend, b, kt, vt, ac.q, ac.kb, ac.vb, ac.knew, ac.vnew, ac.scale);
      CHECK(nmse(got, ac.ref) < 1e-10);
      for (int64_t t = 0; t < b.n_tok(); t += 3) {
        // The cache as the whole batch left it: every row of the batch written, then row t alone.
        PagedBatch one = b;
        one.pos = pick_rows(b.pos, {t}, 1);
        one.seq = pick_rows(b.seq, {t}, 1);
        one.slots = pick_rows(b.slots, {t}, 1);
        std::vector<uint8_t> kb = ac.kb, vb = ac.vb;
        const std::vector<uint8_t> kn = encode(kt, ac.knew, b.n_tok(), row), vn = encode(vt, ac.vnew, b.n_tok(), row);
        const size_t krb = quant::row_size(kt, row).value(), vrb = quant::row_size(vt, row).value();
        for (int64_t i = 0; i < b.n_tok(); ++i) {
          std::memcpy(kb.data() + static_cast<size_t>(b.slots[i]) * krb, kn.data() + static_cast<size_t>(i) * krb, krb);
          std::memcpy(vb.data() + static_cast<size_t>(b.slots[i]) * vrb, vn.data() + static_cast<size_t>(i) * vrb, vrb);
        }
        const std::vector<float> alone =
            run_paged_attention(*c.backend, one, kt, vt, pick_rows(ac.q, {t}, qrow), kb, vb,
                                pick_rows(ac.knew, {t}, row), pick_rows(ac.vnew, {t}, row), ac.scale);
        INFO(c.label, " ", quant::find_traits(kt)->name, " row ", t, " (position ", b.pos[t], ")");
        CHECK(std::memcmp(alone.data(), got.data() + t * qrow, static_cast<size_t>(qrow) * 4) == 0);
      }
    });
  }
}

TEST_CASE("ops: attention on CUDA tensor cores: prefill runs, decode rows, chunks, batch-independent rows") {
  // KITE_CUDA_ATTN_TC=1 sends every batch to the tensor-core kernel (other backends ignore it).
  // Queries and probabilities are rounded to half there, so the bound is half precision's; the
  // error must also exceed the CUDA-core kernel's (< 1e-10), or the tensor cores did not run.
  const ScopedEnv env("KITE_CUDA_ATTN_TC", "1");
  struct Shape {
    int64_t hd, nh, nkv;
    std::vector<std::pair<int, int>> seqs;
  };
  // Prefill from 0; a decode token with two chunks; a short run; a run crossing the 512-key chunk
  // boundary; GQA groups 4, 6 and 1 (64 tokens per block: the 70-token run spans two blocks).
  const Shape shapes[] = {{64, 8, 2, {{0, 40}, {700, 1}, {20, 5}, {1100, 1}, {500, 30}}},
                          {128, 12, 2, {{3, 2}, {600, 20}, {40, 1}}},
                          {64, 4, 4, {{5, 70}, {30, 1}}}};
  const std::pair<DType, DType> types[] = {{DType::F16, DType::F16}, {DType::Q8_0, DType::Q8_0}, {DType::F16, DType::Q8_0}};
  uint32_t seed = 300;
  // (With gemma's sliding window and soft-capping too: a window starts anywhere in a tile.)
  for (const int32_t window : {0, 100})
  for (const Shape& sh : shapes)
    for (auto [kt, vt] : types) {
      PagedBatch b = make_batch(sh.hd, sh.nh, sh.nkv, sh.seqs, seed);
      b.window = window;
      b.softcap = window > 0 ? 0.75f : 0.f;
      const AttentionCase ac = make_case(b, kt, vt, seed += 10);
      const int64_t row = b.hd * b.nkv, qrow = b.hd * b.nh;
      for_each_config([&](const Config& c) {
        if (c.label != "cuda") return;
        INFO("k ", quant::find_traits(kt)->name, " v ", quant::find_traits(vt)->name, " hd=", b.hd, " nh=", b.nh,
             " nkv=", b.nkv, " n_tok=", b.n_tok());
        const std::vector<float> got =
            run_paged_attention(*c.backend, b, kt, vt, ac.q, ac.kb, ac.vb, ac.knew, ac.vnew, ac.scale);
        const double e = nmse(got, ac.ref);
        CHECK(e < 2e-6);
        CHECK(e > 1e-10);
        // Each sequence's rows run alone (the same cache and table) give the same bits: a row's
        // result does not depend on the rows sharing its tile or block.
        for (int32_t s = 0; s < static_cast<int32_t>(sh.seqs.size()); ++s) {
          std::vector<int64_t> rows;
          for (int64_t t = 0; t < b.n_tok(); ++t)
            if (b.seq[t] == s) rows.push_back(t);
          PagedBatch one = b;
          one.pos = pick_rows(b.pos, rows, 1);
          one.seq = pick_rows(b.seq, rows, 1);
          one.slots = pick_rows(b.slots, rows, 1);
          const std::vector<float> alone =
              run_paged_attention(*c.backend, one, kt, vt, pick_rows(ac.q, rows, qrow), ac.kb, ac.vb,
                                  pick_rows(ac.knew, rows, row), pick_rows(ac.vnew, rows, row), ac.scale);
          const std::vector<float> mixed = pick_rows(got, rows, qrow);
          INFO("sequence ", s);
          CHECK(std::memcmp(alone.data(), mixed.data(), alone.size() * sizeof(float)) == 0);
        }
      });
    }
}

TEST_CASE("ops: attention on CUDA: prefill runs take tensor cores, decode rows the CUDA-core kernel") {
  // By default a sequence with 16 or more consecutive rows in the batch takes the tensor-core
  // kernel, rows of shorter runs the CUDA-core one: each row's bits equal those of the path it
  // was routed to when that path is forced for the whole batch.
  const PagedBatch b = make_batch(64, 8, 2, {{0, 40}, {700, 1}, {20, 5}, {1100, 1}, {500, 30}}, 400);
  const AttentionCase ac = make_case(b, DType::F16, DType::F16, 401);
  const int64_t qrow = b.hd * b.nh;
  for_each_config([&](const Config& c) {
    if (c.label != "cuda") return;
    auto run = [&](const char* tc) {
      const ScopedEnv env("KITE_CUDA_ATTN_TC", tc);
      return run_paged_attention(*c.backend, b, DType::F16, DType::F16, ac.q, ac.kb, ac.vb, ac.knew, ac.vnew, ac.scale);
    };
    const std::vector<float> mixed = run(nullptr), tc = run("1"), cores = run("0");
    CHECK(nmse(mixed, ac.ref) < 2e-6);
    for (int64_t t = 0; t < b.n_tok(); ++t) {
      const bool long_run = b.seq[t] == 0 || b.seq[t] == 4;
      const std::vector<float>& want = long_run ? tc : cores;
      INFO("row ", t, " of sequence ", b.seq[t]);
      CHECK(std::memcmp(mixed.data() + t * qrow, want.data() + t * qrow, qrow * sizeof(float)) == 0);
    }
    CHECK(tc != cores);
  });
}

}  // namespace
}  // namespace kite
