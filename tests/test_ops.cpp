// Op conformance: every op and variant, run through each registered backend (and, for the CPU,
// through every SIMD level this machine supports, forced in turn), compared with naive
// double-precision references written here by normalized mean squared error on random data
// (fixed seeds). The CPU kernel tables against one another: test_ops_cpu_kernels.cpp.
#include <array>
#include <limits>

#include "tests/ops_test_util.h"

namespace kite {
namespace {

using namespace ops_test;

TEST_CASE("ops: mul_mat small batches, every row count 1..17, gemm8 on and off") {
  uint32_t seed = 400;
  cpu::set_wgemm_rows(0, 0);  // gemm8, the per-row dots and the tiles (wgemm: the test below)
  for (int64_t limit : {cpu::kGemmDefaultMaxRows, int64_t{0}}) {
    cpu::set_gemm8_max_rows(limit);
    REQUIRE(cpu::gemm8_max_rows() == limit);
    for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::Q5_K, DType::Q5_0, DType::Q4_1,
                    DType::Q3_K, DType::IQ4_XS})
      for (int64_t n = 1; n <= 17; ++n) {
        // Odd weight-row counts: whole 8-row tiles plus a partial one; 9 blocks of 32.
        const int64_t k = quant::find_traits(t)->block_size == 256 ? 512 : 288;
        check_mul_mat(t, k, n % 2 == 0 ? 21 : 37, n, 1, false, seed++);
      }
    // Past the small-batch range: the packed tiles (or the per-row dots up to 31 rows for Q6_K/Q3_K).
    for (DType t : {DType::Q4_0, DType::Q4_K, DType::Q6_K, DType::Q3_K}) {
      check_mul_mat(t, 256, 21, 24, 1, false, seed++);
      check_mul_mat(t, 256, 21, 33, 1, false, seed++);
    }
  }
  cpu::set_gemm8_max_rows(-1);
  cpu::set_wgemm_rows(-1, -1);
  CHECK(cpu::gemm8_max_rows() == cpu::kGemmDefaultMaxRows);
}

TEST_CASE("ops: mul_mat quantized weights, every type and level") {
  uint32_t seed = 100;
  for (DType t : kQuantTypes) {
    const bool k_quant = quant::find_traits(t)->block_size == 256;
    for (int64_t n : {1, 2, 4, 7, 19}) check_mul_mat(t, 512, 37, n, 1, false, seed++);
    check_mul_mat(t, k_quant ? 256 : 96, 5, 3, 1, false, seed++);
  }
}

TEST_CASE("ops: mul_mat float weights, odd sizes") {
  uint32_t seed = 200;
  for (DType t : kFloatTypes) {
    for (int64_t n : {1, 3, 4, 9}) check_mul_mat(t, 67, 13, n, 1, false, seed++);
    check_mul_mat(t, 512, 33, 5, 1, false, seed++);
  }
}

TEST_CASE("ops: mul_mat tall weights and long rows (more than one workgroup's rows)") {
  uint32_t seed = 600;
  for (DType t : kQuantTypes)
    for (int64_t n : {1, 9}) check_mul_mat(t, 512, 300, n, 1, false, seed++);
  for (DType t : kFloatTypes) check_mul_mat(t, 520, 300, 9, 1, false, seed++);
  check_mul_mat(DType::Q4_K, 4096, 513, 1, 1, false, seed++);
  check_mul_mat(DType::Q8_0, 4096, 513, 3, 1, false, seed++);
}

TEST_CASE("ops: mul_mat 3-D and strided activations") {
  uint32_t seed = 300;
  for (DType t : {DType::F32, DType::F16, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    check_mul_mat(t, 256, 21, 3, 2, false, seed++);
    check_mul_mat(t, 256, 21, 3, 2, true, seed++);
    check_mul_mat(t, 256, 21, 5, 2, true, seed++);   // 10 rows: wgemm
    check_mul_mat(t, 256, 21, 20, 2, true, seed++);  // 40 rows: wgemm too (tiles past 64 rows)
  }
}

// ---------------------------------------------------------------------------------------------
// The other ops.

TEST_CASE("ops: add, mul, scale, softcap, swiglu, geglu with broadcast") {
  const int64_t ne0 = 37, rows = 6;
  std::vector<float> a = randn(ne0 * rows, 1);
  const std::vector<float> b = randn(ne0 * rows, 2), b1 = randn(ne0, 3);
  for (size_t i = 0; i < a.size(); i += 5) a[i] *= 6.f;  // (the activations' tails too)
  std::vector<double> add(a.size()), mul(a.size()), addb(a.size()), scale(a.size()), sw(a.size()), gg(a.size()),
      cap(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    add[i] = static_cast<double>(a[i]) + b[i];
    mul[i] = static_cast<double>(a[i]) * b[i];
    addb[i] = static_cast<double>(a[i]) + b1[i % ne0];
    scale[i] = a[i] * 0.375;
    sw[i] = a[i] / (1.0 + std::exp(-static_cast<double>(a[i]))) * b[i];
    const double x = a[i];  // gelu, tanh form
    gg[i] = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * b[i];
    cap[i] = 2.5 * std::tanh(x / 2.5);
  }
  auto binary = [&](int which, bool bcast) {
    return [&, which, bcast](Backend& be) {
      Graph g;
      Tensor* ta = g.input(DType::F32, {ne0, 3, 2}, "a");
      Tensor* tb = bcast ? g.input(DType::F32, {ne0}, "b") : g.input(DType::F32, {ne0, 3, 2}, "b");
      Tensor* y = which == 0   ? g.add(ta, tb)
                  : which == 1 ? g.mul(ta, tb)
                  : which == 2 ? g.swiglu(ta, tb)
                  : which == 4 ? g.geglu(ta, tb)
                  : which == 5 ? g.softcap(ta, 2.5f)
                               : g.scale(ta, 0.375f);
      if (which == 3 || which == 5) return run_graph(be, g, y, {{ta, bytes_of(a)}});  // tb is not in the graph
      return run_graph(be, g, y, {{ta, bytes_of(a)}, {tb, bytes_of(bcast ? b1 : b)}});
    };
  };
  check_op("add", add, 1e-12, binary(0, false));
  check_op("add broadcast", addb, 1e-12, binary(0, true));
  check_op("mul", mul, 1e-12, binary(1, false));
  check_op("swiglu", sw, 1e-10, binary(2, false));
  check_op("geglu", gg, 1e-10, binary(4, false));
  check_op("softcap", cap, 1e-10, binary(5, false));
  check_op("scale", scale, 1e-12, binary(3, false));
}

TEST_CASE("ops: rms_norm with and without weight") {
  for (int64_t ne0 : {67, 2048}) {
    const int64_t rows = 5;
    const std::vector<float> x = randn(static_cast<size_t>(ne0 * rows), 11, 2.f), w = randn(static_cast<size_t>(ne0), 12);
    for (bool with_w : {false, true}) {
      std::vector<double> ref(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < ne0; ++i) ss += static_cast<double>(x[r * ne0 + i]) * x[r * ne0 + i];
        const double s = 1.0 / std::sqrt(ss / ne0 + 1e-5);
        for (int64_t i = 0; i < ne0; ++i) ref[r * ne0 + i] = x[r * ne0 + i] * s * (with_w ? w[i] : 1.f);
      }
      check_op(with_w ? "rms_norm*w" : "rms_norm", ref, 1e-11, [&](Backend& be) {
        Graph g;
        Tensor* tx = g.input(DType::F32, {ne0, rows}, "x");
        Tensor* tw = g.input(DType::F32, {ne0}, "w");
        Tensor* y = g.rms_norm(tx, with_w ? tw : nullptr, 1e-5f);
        std::vector<Input> in = {{tx, bytes_of(x)}};
        if (with_w) in.push_back({tw, bytes_of(w)});
        return run_graph(be, g, y, in);
      });
    }
  }
}

TEST_CASE("ops: rope norm and neox, full and partial, linear scaling") {
  const int64_t hd = 64, nh = 3, nt = 4;
  const std::vector<float> x = randn(static_cast<size_t>(hd * nh * nt), 21);
  const std::vector<int32_t> pos = {0, 5, 17, 300};
  for (RopeMode mode : {RopeMode::kNorm, RopeMode::kNeox}) {
    for (int n_rot : {64, 32}) {
      for (float factor : {1.f, 4.f}) {
        RopeParams p;
        p.mode = mode;
        p.n_rot = n_rot;
        p.freq_base = 10000.f;
        p.scaling = factor == 1.f ? RopeScaling::kNone : RopeScaling::kLinear;
        p.factor = factor;
        std::vector<double> ref(x.begin(), x.end());
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t h = 0; h < nh; ++h)
            for (int i = 0; i < n_rot / 2; ++i) {
              const double theta = pos[t] * std::pow(10000.0, -2.0 * i / n_rot) / factor;
              const int64_t base = (t * nh + h) * hd;
              const int64_t i0 = base + (mode == RopeMode::kNorm ? 2 * i : i);
              const int64_t i1 = base + (mode == RopeMode::kNorm ? 2 * i + 1 : i + n_rot / 2);
              ref[i0] = x[i0] * std::cos(theta) - x[i1] * std::sin(theta);
              ref[i1] = x[i0] * std::sin(theta) + x[i1] * std::cos(theta);
            }
        check_op("rope", ref, 1e-9, [&](Backend& be) {
          Graph g;
          Tensor* tx = g.input(DType::F32, {hd, nh, nt}, "x");
          Tensor* tp = g.input(DType::I32, {nt}, "pos");
          Tensor* y = g.rope(tx, tp, p);
          return run_graph(be, g, y, {{tx, bytes_of(x)}, {tp, bytes_of_i32(pos)}});
        });
      }
    }
  }
}

TEST_CASE("ops: get_rows, copy and kv_write") {
  const int64_t ne0 = 256, rows = 9;
  const std::vector<float> table = randn(static_cast<size_t>(ne0 * rows), 31);
  const std::vector<int32_t> ids = {3, 0, 8, 3};
  std::vector<DType> types(std::begin(kFloatTypes), std::end(kFloatTypes));
  types.insert(types.end(), std::begin(kQuantTypes), std::end(kQuantTypes));
  for (DType t : types) {
    const std::vector<uint8_t> tb = encode(t, table, rows, ne0);
    const std::vector<float> td = decode(t, tb, ne0 * rows);
    std::vector<double> ref;
    for (int32_t id : ids) ref.insert(ref.end(), td.begin() + id * ne0, td.begin() + (id + 1) * ne0);
    INFO("table type ", quant::find_traits(t)->name);
    check_op("get_rows", ref, 1e-14, [&](Backend& be) {
      Graph g;
      Tensor* tt = g.input(t, {ne0, rows}, "table");
      Tensor* ti = g.input(DType::I32, {static_cast<int64_t>(ids.size())}, "ids");
      return run_graph(be, g, g.get_rows(tt, ti), {{tt, tb}, {ti, bytes_of_i32(ids)}});
    });
  }
  // copy F32 -> F16 / BF16 / Q8_0 and back to F32.
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0}) {
    const std::vector<float> td = decode(t, encode(t, table, rows, ne0), ne0 * rows);
    check_op("copy", std::vector<double>(td.begin(), td.end()), 1e-14, [&](Backend& be) {
      Graph g;
      Tensor* tx = g.input(DType::F32, {ne0, rows}, "x");
      return run_graph(be, g, g.copy(g.copy(tx, t), DType::F32), {{tx, bytes_of(table)}});
    });
  }
  // kv_write into an F16 cache of 12 slots.
  const int64_t slots = 12;
  const std::vector<int32_t> where = {7, 2, 11};
  const std::vector<float> newrows(table.begin(), table.begin() + 3 * ne0);
  const std::vector<float> rd = decode(DType::F16, encode(DType::F16, newrows, 3, ne0), 3 * ne0);
  std::vector<double> ref(static_cast<size_t>(ne0 * slots), 0.0);
  for (size_t r = 0; r < where.size(); ++r)
    for (int64_t i = 0; i < ne0; ++i) ref[where[r] * ne0 + i] = rd[r * ne0 + i];
  check_op("kv_write", ref, 1e-14, [&](Backend& be) {
    Graph g;
    Tensor* cache = g.input(DType::F16, {ne0, slots}, "cache");
    Tensor* tr = g.input(DType::F32, {ne0, 3}, "rows");
    Tensor* ts = g.input(DType::I32, {3}, "slots");
    return run_graph(be, g, g.kv_write(cache, tr, ts),
                     {{cache, std::vector<uint8_t>(static_cast<size_t>(ne0 * slots * 2), 0)},
                      {tr, bytes_of(newrows)},
                      {ts, bytes_of_i32(where)}});
  });
}

TEST_CASE("ops: mul_mat batched decode 2..70 rows, wgemm on and off") {
  uint32_t seed = 950;
  for (bool wide : {true, false}) {
    if (wide) cpu::set_wgemm_rows(-1, -1);
    else cpu::set_wgemm_rows(0, 0);
    CHECK(cpu::wgemm_max_rows() == (wide ? -1 : 0));
    for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q3_K, DType::IQ4_XS,
                    DType::Q4_1})
      for (int64_t n : {2, 6, 9, 12, 17, 24, 32, 40, 70}) {
        // Whole 16-row tiles plus a partial one; K types: two super-blocks.
        const int64_t k = quant::find_traits(t)->block_size == 256 ? 512 : 288;
        check_mul_mat(t, k, n % 2 == 0 ? 37 : 21, n, 1, false, seed++);
      }
  }
  // More rows than one wgemm call takes (kWideGemmMaxNa), for the 32-element-scale types too.
  cpu::set_wgemm_rows(-1, 1000);
  for (DType t : {DType::Q4_0, DType::Q4_K, DType::IQ4_XS})
    check_mul_mat(t, quant::find_traits(t)->block_size == 256 ? 512 : 288, 21, 70, 1, false, seed++);
  cpu::set_wgemm_rows(-1, -1);
  CHECK(cpu::wgemm_min_rows() == -1);
}

// The codebook types (random blocks, so that every codebook entry occurs) on every path: the per-row
// dots (1-31 rows), the 16-element-scale tiles (32 rows and more: at the VNNI levels, and for
// IQ1_S/IQ1_M at AVX2), wgemm and the wide tiles (AVX-512: 9-64 rows, past 64).
TEST_CASE("ops: mul_mat and get_rows of the IQ codebook types, every level and path") {
  uint32_t seed = 1700;
  for (bool wide : {true, false}) {
    cpu::set_wgemm_rows(wide ? -1 : 0, wide ? -1 : 0);
    for (DType t : kIqTypes)
      for (int64_t n : {1, 2, 4, 7, 12, 33, 70}) check_mul_mat(t, 512, n % 2 == 0 ? 37 : 21, n, 1, false, seed++);
  }
  cpu::set_wgemm_rows(-1, -1);
  const int64_t ne0 = 512, rows = 5;
  const std::vector<int32_t> ids = {4, 0, 2};
  for (DType t : kIqTypes) {
    const std::vector<uint8_t> tb = encode(t, randn(static_cast<size_t>(ne0 * rows), seed++), rows, ne0);
    const std::vector<float> td = decode(t, tb, ne0 * rows);
    std::vector<double> ref;
    for (int32_t id : ids) ref.insert(ref.end(), td.begin() + id * ne0, td.begin() + (id + 1) * ne0);
    for_each_config([&](const Config& c) {
      Graph g;
      Tensor* tt = g.input(t, {ne0, rows}, "table");
      Tensor* ti = g.input(DType::I32, {static_cast<int64_t>(ids.size())}, "ids");
      Tensor* out = g.get_rows(tt, ti);
      const std::vector<float> got = run_graph(*c.backend, g, out, {{tt, tb}, {ti, bytes_of_i32(ids)}});
      INFO("get_rows ", quant::find_traits(t)->name, " on ", c.label);
      CHECK(nmse(got, ref) == 0.0);
    });
  }
}

TEST_CASE("ops: rope with frequency factors (llama.cpp's rope_freqs), which replace the llama3 formula") {
  const int64_t hd = 64, nh = 2, nt = 3;
  const std::vector<float> x = randn(static_cast<size_t>(hd * nh * nt), 31);
  const std::vector<int32_t> pos = {0, 7, 4000};
  std::vector<float> ff(static_cast<size_t>(hd / 2));
  for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.f + 7.f * static_cast<float>(i) / static_cast<float>(ff.size());
  for (RopeScaling scaling : {RopeScaling::kNone, RopeScaling::kLlama3}) {
    RopeParams p;
    p.mode = RopeMode::kNorm;
    p.n_rot = static_cast<int32_t>(hd);
    p.freq_base = 500000.f;
    p.scaling = scaling;  // kLlama3 with factors: the factors alone apply
    p.factor = 32.f;
    p.original_ctx = 8192;
    std::vector<double> ref(x.begin(), x.end());
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t h = 0; h < nh; ++h)
        for (int i = 0; i < hd / 2; ++i) {
          const double theta = pos[t] * std::pow(500000.0, -2.0 * i / hd) / ff[static_cast<size_t>(i)];
          const int64_t i0 = (t * nh + h) * hd + 2 * i, i1 = i0 + 1;
          ref[i0] = x[i0] * std::cos(theta) - x[i1] * std::sin(theta);
          ref[i1] = x[i0] * std::sin(theta) + x[i1] * std::cos(theta);
        }
    check_op("rope+factors", ref, 1e-9, [&](Backend& be) {
      Graph g;
      Tensor* tx = g.input(DType::F32, {hd, nh, nt}, "x");
      Tensor* tp = g.input(DType::I32, {nt}, "pos");
      Tensor* tf = g.input(DType::F32, {hd / 2}, "freq_factors");
      Tensor* y = g.rope(tx, tp, p, tf);
      return run_graph(be, g, y, {{tx, bytes_of(x)}, {tp, bytes_of_i32(pos)}, {tf, bytes_of(ff)}});
    });
  }
}

// The reference for top_k: every entry that is neither NaN nor -inf, sorted by (value desc,
// index asc) — a full sort, not the kernels' selection.
static std::vector<float> top_k_reference(const std::vector<float>& x, int64_t n, int64_t rows, int k, bool lse) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = &x[static_cast<size_t>(r * n)];
    std::vector<int32_t> idx;
    for (int32_t i = 0; i < n; ++i)
      if (row[i] > -INFINITY) idx.push_back(i);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (int j = 0; j < k; ++j) out.push_back(j < static_cast<int>(idx.size()) ? row[idx[j]] : -INFINITY);
    for (int j = 0; j < k; ++j) out.push_back(j < static_cast<int>(idx.size()) ? static_cast<float>(idx[j]) : -1.f);
    double m = -INFINITY, s = 0;
    for (int32_t i = 0; i < n; ++i)
      if (row[i] == row[i]) m = std::max(m, static_cast<double>(row[i]));
    for (int32_t i = 0; i < n && std::isfinite(m); ++i)
      if (row[i] == row[i]) s += std::exp(row[i] - m);
    out.push_back(!lse ? 0.f : std::isfinite(m) ? static_cast<float>(m + std::log(s)) : static_cast<float>(m));
  }
  return out;
}

TEST_CASE("ops: top_k selects each row's best entries, ties to the lower index, skipping NaN and -inf") {
  struct Case {
    const char* what;
    int64_t n, rows;
    int k;
    bool lse;
    std::function<float(std::mt19937&, int64_t r, int64_t i)> value;
  };
  std::normal_distribution<float> normal(0.f, 3.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> cases = {
      {"random logits", 4096, 5, 64, true, [&](std::mt19937& g, int64_t, int64_t) { return normal(g); }},
      {"k = 1 (greedy)", 1000, 3, 1, false, [&](std::mt19937& g, int64_t, int64_t) { return normal(g); }},
      // Few distinct values: the k-th largest is shared by many entries, which must be taken lowest
      // index first (the CUDA kernel's ordered tie path).
      {"heavy ties", 3000, 4, 40, true,
       [&](std::mt19937& g, int64_t, int64_t) { return std::round(normal(g)) * 0.5f; }},
      {"all equal", 700, 2, 128, false, [](std::mt19937&, int64_t, int64_t) { return 1.25f; }},
      {"signed zeros", 500, 2, 16, false,
       [](std::mt19937& g, int64_t, int64_t i) { return i % 7 == 0 ? (g() % 2 ? 0.f : -0.f) : -1.f - float(i % 5); }},
      // NaN and -inf are never candidates; rows with fewer allowed entries than k pad, and a
      // row with none has log-sum-exp -inf.
      {"NaN, -inf, short rows", 2000, 4, 32, true,
       [&](std::mt19937& g, int64_t r, int64_t i) {
         if (r == 2) return i % 400 == 3 ? normal(g) : -INFINITY;  // 5 allowed entries
         if (r == 3) return i % 9 == 0 ? nan : -INFINITY;          // none
         return i % 11 == 0 ? nan : i % 13 == 0 ? -INFINITY : normal(g);
       }},
      {"fewer entries than k", 50, 3, 64, true, [&](std::mt19937& g, int64_t, int64_t) { return normal(g); }},
      {"k = 1 over NaN, -inf and signed zeros", 1500, 4, 1, true,
       [&](std::mt19937& g, int64_t r, int64_t i) {
         if (r == 0) return i % 3 == 0 ? nan : -INFINITY;                                  // nothing allowed
         if (r == 1) return i % 97 == 5 ? (g() % 2 ? 0.f : -0.f) : -1.f;                 // ties at zero
         return i % 5 == 0 ? nan : i % 7 == 0 ? -INFINITY : normal(g);
       }},
      {"huge and tiny magnitudes", 3000, 2, 24, true,
       [&](std::mt19937& g, int64_t, int64_t i) { return i % 3 == 0 ? normal(g) * 1e30f : normal(g) * 1e-30f; }},
      // A vocabulary-sized row (CUDA: the 1024-thread blocks) at the largest k.
      {"a 128K vocabulary", 131072, 2, 128, true, [&](std::mt19937& g, int64_t, int64_t) { return normal(g); }},
  };
  for (const Case& tc : cases) {
    std::mt19937 g(7);
    std::vector<float> x(static_cast<size_t>(tc.n * tc.rows));
    for (int64_t r = 0; r < tc.rows; ++r)
      for (int64_t i = 0; i < tc.n; ++i) x[static_cast<size_t>(r * tc.n + i)] = tc.value(g, r, i);
    const std::vector<float> ref = top_k_reference(x, tc.n, tc.rows, tc.k, tc.lse);
    for_each_config([&](const Config& c) {
      Graph g2;
      // (Rows as a 3-D tensor when there are several: the op walks any row layout.)
      Tensor* a = tc.rows % 2 == 0 ? g2.input(DType::F32, {tc.n, 2, tc.rows / 2}, "a")
                                   : g2.input(DType::F32, {tc.n, tc.rows}, "a");
      Tensor* y = g2.top_k(a, tc.k, tc.lse);
      INFO(tc.what, " on ", c.label);
      REQUIRE(c.backend->supports(*y));
      const std::vector<float> got = run_graph(*c.backend, g2, y, {{a, bytes_of(x)}});
      REQUIRE(got.size() == ref.size());
      const size_t w = static_cast<size_t>(2 * tc.k + 1);
      for (size_t r = 0; r < static_cast<size_t>(tc.rows); ++r)
        for (size_t j = 0; j < w; ++j) {
          const float e = ref[r * w + j], v = got[r * w + j];
          INFO("row ", r, " entry ", j);
          if (j + 1 < w) {  // values and indices exactly (signed zeros compare equal)
            CHECK(v == e);
          } else if (std::isinf(e)) {
            CHECK(v == e);
          } else {
            CHECK(std::abs(v - e) <= 1e-5f * std::max(1.f, std::abs(e)));
          }
        }
    });
  }
}

// Graph::top_k's draw, computed here as the contract states: float weights, summed in double in
// index order. Returns the token and, through `lo`/`hi`, the running sums around it.
static int32_t reference_draw(const float* x, int64_t n, float t, double u, double* lo, double* hi, double* total) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > m) m = x[i];
  *total = 0;
  if (!(t > 0.f) || !(m > -INFINITY)) return -1;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > -INFINITY) *total += std::exp((x[i] - m) * (1.f / t)), last = i;
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(x[i] > -INFINITY)) continue;
    *lo = acc;
    acc += std::exp((x[i] - m) * (1.f / t));
    *hi = acc;
    if (u * *total < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);
}

TEST_CASE("ops: top_k draws a token from the whole row at a temperature with a given uniform, and gives its logit") {
  const int64_t n = 5000, rows = 8;
  std::mt19937 g(3);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<float> x(static_cast<size_t>(n * rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      float v = normal(g);
      if (r == 5 && i % 3 != 0) v = -INFINITY;          // few allowed
      if (r == 6) v = i % 2 ? NAN : -INFINITY;          // none allowed: -1
      if (r == 7 && i % 17 == 0) v = NAN;               // NaN skipped
      x[static_cast<size_t>(r * n + i)] = v;
    }
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<int32_t> words(static_cast<size_t>(4 * rows));
    std::vector<float> temp(static_cast<size_t>(rows));
    std::vector<double> us(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      constexpr std::array<float, 4> kTemps = {0.3f, 0.8f, 1.f, 2.5f};
      temp[static_cast<size_t>(r)] = r == 4 ? 0.f : kTemps[static_cast<size_t>((r + trial) % 4)];
      us[static_cast<size_t>(r)] = trial == 0 ? 0.0 : trial == 1 ? 0x1.fffffffffffffp-1 : uniform(g);
      pack_draw(temp[static_cast<size_t>(r)], us[static_cast<size_t>(r)], &words[static_cast<size_t>(4 * r)]);
    }
    std::vector<uint8_t> wb(words.size() * 4);
    std::memcpy(wb.data(), words.data(), wb.size());
    for_each_config([&](const Config& c) {
      Graph gr;
      Tensor* a = gr.input(DType::F32, {n, rows}, "a");
      Tensor* d = gr.input(DType::I32, {4, rows}, "draws");
      Tensor* y = gr.top_k(a, 8, false, d);
      INFO("trial ", trial, " on ", c.label);
      REQUIRE(c.backend->supports(*y));
      const std::vector<float> got = run_graph(*c.backend, gr, y, {{a, bytes_of(x)}, {d, wb}});
      for (int64_t r = 0; r < rows; ++r) {
        double lo = 0, hi = 0, total = 0;
        const int32_t ref = reference_draw(&x[static_cast<size_t>(r * n)], n, temp[static_cast<size_t>(r)],
                                           us[static_cast<size_t>(r)], &lo, &hi, &total);
        const auto drawn = static_cast<int32_t>(got[static_cast<size_t>(r * 19 + 17)]);
        INFO("row ", r, " reference ", ref, " drawn ", drawn);
        // With the drawn token's logit (its logprob, whether or not it is among the top k).
        const float logit = got[static_cast<size_t>(r * 19 + 18)];
        if (drawn >= 0) {
          REQUIRE(drawn < n);
          CHECK(logit == x[static_cast<size_t>(r * n + drawn)]);
        } else {
          CHECK(logit == -INFINITY);
        }
        if (c.cpu || drawn == ref) {  // the CPU sums exactly as the reference does
          CHECK(drawn == ref);
        } else {  // a device sums in another order: only a target at a boundary may move
          const double target = us[static_cast<size_t>(r)] * total;
          CHECK((std::abs(target - lo) < 1e-9 * total || std::abs(target - hi) < 1e-9 * total));
        }
      }
    });
  }
}

TEST_CASE("ops: mul_mat_id and moe_sum (mixture of experts) against a double reference, routes with padding") {
  const int64_t k = 256, m = 96, n_expert = 8;
  struct Case {
    DType type;
    int64_t n;       // tokens
    int32_t n_used;  // experts a token
    bool per_slot;   // x [k, n_used, n] (the down projection) or [k, 1, n] (gate and up)
    bool norm;
    float scale;
  };
  const Case cases[] = {
      {DType::F16, 1, 2, false, true, 0.f},    {DType::Q8_0, 5, 2, true, true, 0.f},
      {DType::Q4_K, 17, 3, false, false, 0.f}, {DType::Q6_K, 1, 8, true, true, 2.5f},
      {DType::Q4_0, 33, 2, true, true, 0.f},   {DType::IQ4_XS, 3, 4, false, true, 0.f},
      {DType::IQ2_XS, 9, 2, true, true, 0.f},  {DType::F32, 64, 1, false, true, 0.f},
  };
  for (const Case& tc : cases) {
    const uint32_t seed = static_cast<uint32_t>(tc.n * 31 + tc.n_used);
    const std::vector<float> wf = randn(static_cast<size_t>(k * m * n_expert), seed);
    const std::vector<uint8_t> wb = encode(tc.type, wf, m * n_expert, k);
    const std::vector<float> wd = decode(tc.type, wb, k * m * n_expert);
    const int64_t nx = tc.per_slot ? tc.n_used : 1;
    const std::vector<float> xf = randn(static_cast<size_t>(k * nx * tc.n), seed + 1);
    // Router logits; the last token's row is NaN but for one entry, so its route pads with -1
    // (a token that chooses fewer experts than n_used) when n_used > 1.
    std::vector<float> logits = randn(static_cast<size_t>(n_expert * tc.n), seed + 2, 2.f);
    for (int64_t e = 1; e < n_expert; ++e)
      logits[static_cast<size_t>((tc.n - 1) * n_expert + e)] = std::numeric_limits<float>::quiet_NaN();
    // The reference: top n_used of each row (ties: lower index; NaN never), softmax weights.
    std::vector<double> ref_y(static_cast<size_t>(m * tc.n_used * tc.n), 0.0),
        ref_sum(static_cast<size_t>(m * tc.n), 0.0);
    for (int64_t t = 0; t < tc.n; ++t) {
      const float* l = &logits[static_cast<size_t>(t * n_expert)];
      std::vector<int> order;
      for (int e = 0; e < n_expert; ++e)
        if (!std::isnan(l[e])) order.push_back(e);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
      double z = 0;
      for (int e : order) z += std::exp(static_cast<double>(l[e]));
      std::vector<double> wts;
      for (int j = 0; j < tc.n_used && j < static_cast<int>(order.size()); ++j)
        wts.push_back(std::exp(static_cast<double>(l[order[static_cast<size_t>(j)]])) / z);
      double wsum = 0;
      for (double w : wts) wsum += w;
      for (int j = 0; j < static_cast<int>(wts.size()); ++j) {
        const int e = order[static_cast<size_t>(j)];
        const float* xr = &xf[static_cast<size_t>((t * nx + (tc.per_slot ? j : 0)) * k)];
        const double wj = wts[static_cast<size_t>(j)] / (tc.norm ? wsum : 1.0) * (tc.scale != 0.f ? tc.scale : 1.0);
        for (int64_t i = 0; i < m; ++i) {
          double s = 0;
          for (int64_t q = 0; q < k; ++q)
            s += static_cast<double>(wd[static_cast<size_t>((e * m + i) * k + q)]) * xr[q];
          ref_y[static_cast<size_t>((t * tc.n_used + j) * m + i)] = s;
          ref_sum[static_cast<size_t>(t * m + i)] += wj * s;
        }
      }
    }
    for_each_config([&](const Config& c) {
      INFO(c.label, " ", quant::find_traits(tc.type)->name, " n=", tc.n, " n_used=", tc.n_used,
           tc.per_slot ? " per slot" : " shared x");
      for (bool sum : {false, true}) {
        Graph g;
        Tensor* w = g.input(tc.type, {k, m, n_expert}, "w");
        Tensor* x = g.input(DType::F32, {k, nx, tc.n}, "x");
        Tensor* l = g.input(DType::F32, {n_expert, tc.n}, "logits");
        Tensor* route = g.top_k(l, tc.n_used, true);
        Tensor* y = g.mul_mat_id(w, x, route, tc.n_used);
        Tensor* out = sum ? g.moe_sum(y, route, tc.n_used, tc.norm, tc.scale) : y;
        if (!c.backend->supports(*y) || !c.backend->supports(*out)) {
          REQUIRE_MESSAGE(!c.cpu, "the CPU runs every op");
          static std::set<std::string> said;  // (once per backend)
          if (said.insert(c.label).second)
            MESSAGE(c.label, ": no mul_mat_id/moe_sum kernels (an MoE model's experts run on the CPU there)");
          return;
        }
        const std::vector<float> got =
            run_graph(*c.backend, g, out, {{w, wb}, {x, bytes_of(xf)}, {l, bytes_of(logits)}});
        const double bound = std::max(mul_mat_bound(c, tc.type, 1), mul_mat_bound(c, tc.type, tc.n * tc.n_used));
        CHECK(nmse(got, sum ? ref_sum : ref_y) < bound);
        if (!sum && tc.n_used > 1) {  // the padded slot of the last token: zeros
          const size_t pad = static_cast<size_t>(((tc.n - 1) * tc.n_used + 1) * m);
          CHECK(std::all_of(got.begin() + static_cast<std::ptrdiff_t>(pad),
                            got.begin() + static_cast<std::ptrdiff_t>(pad + static_cast<size_t>(m)),
                            [](float v) { return v == 0.f; }));
        }
      }
    });
  }
}

}  // namespace
}  // namespace kite
