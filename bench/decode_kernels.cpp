// kite-decode-kernels: single-thread throughput of the decode (one activation row) dot kernels
// of each x86 level, with the weights hot in cache (kernel cost) and streamed from DRAM
// (kernel + memory), and of the one-row gemv kernel where the level has one (and its four-row
// form, gemv4, with the bits it gives checked against gemv's); then, for small
// batches of na activation rows, GB/s of weights read by the ways mul_mat can take them: the
// per-row dots (4 rows per call), gemm8 (weights read in place, all rows per block), pack +
// tile_dot (the prefill tiles, packed every step), the wide 16-row tiles (packed every step) and
// wgemm (16 weight rows read in place, decoded once for all rows).
// Not run in CI.
//
//   kite-decode-kernels [--types q4_0,q8_0,q4_K,q6_K] [--k 2048] [--na 1,2,4,8,16] [--level avx512]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/matmul.h"
#include "formats/quant/types.h"

namespace {

using namespace kite;

// CPU time of this thread: the machine may be shared, wall time would count other programs.
double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// GB/s of weights read by `dot` over `bytes` of rows, cycling `reps` times.
double run(cpu::VecDotFn dot, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t k, const uint8_t* act,
           double min_s) {
  float sink = 0.f, r = 0.f;
  int64_t done = 0;
  const double t0 = thread_seconds();
  double el = 0;
  do {
    for (int64_t i = 0; i < rows; ++i) {
      dot(k, w + static_cast<size_t>(i) * row_bytes, act, 0, &r);
      sink += r;
    }
    done += rows;
    el = thread_seconds() - t0;
  } while (el < min_s);
  if (sink == 12345.f) std::printf(" ");
  return static_cast<double>(done) * static_cast<double>(row_bytes) / el / 1e9;
}


// Weight GB/s of `step` (one pass over `rows` weight rows against na activation rows) over
// min_s seconds of thread CPU time.
double run_rows(const std::function<void(int64_t)>& step, size_t row_bytes, int64_t rows, double min_s) {
  int64_t done = 0;
  const double t0 = thread_seconds();
  double el = 0;
  do {
    step(rows);
    done += rows;
    el = thread_seconds() - t0;
  } while (el < min_s);
  return static_cast<double>(done) * static_cast<double>(row_bytes) / el / 1e9;
}

// Small-batch throughput for one type and level: per-row dots, gemm8 and packed tiles.
void bench_batches(const cpu::MatmulKernels& mk, const char* level, const quant::TypeTraits& tr, int64_t k,
                   const std::vector<float>& x, const std::vector<uint8_t>& w, size_t row_bytes, int64_t cold_rows,
                   const std::vector<int>& nas) {
  const auto id = static_cast<size_t>(tr.type);
  const cpu::TileKernels tk = cpu::tile_kernels(&mk, static_cast<DType>(tr.type));
  const bool t16 = tk.q8u();
  const cpu::ActFormat rf = cpu::act_format(static_cast<DType>(tr.type));
  const cpu::ActFormat tf = t16 ? cpu::ActFormat::kQ8U : cpu::ActFormat::kQ8;
  const int max_na = *std::max_element(nas.begin(), nas.end());
  const size_t rab = cpu::act_row_bytes(rf, k), tab = cpu::act_row_bytes(tf, k);
  std::vector<uint8_t> ar(rab * max_na + 64), at(tab * max_na + 64);
  for (int j = 0; j < max_na; ++j) {
    const float* xr = x.data() + static_cast<size_t>(j % 4) * static_cast<size_t>(k);
    (rf == cpu::ActFormat::kQ8K ? mk.quantize_q8k : mk.quantize_q8)(xr, ar.data() + rab * j, k);
    mk.quantize_q8(xr, at.data() + tab * j, k);
    if (t16) cpu::act_q8_to_q8u(at.data() + tab * j, k);
  }
  std::vector<uint8_t> tile(static_cast<size_t>(k / 32) * tk.block_bytes);
  const int64_t hot_rows = std::max<int64_t>(64, static_cast<int64_t>((256u << 10) / row_bytes)) / 8 * 8;
  float out[cpu::kGemmMaxNa * cpu::kTileRows];
  float sink = 0.f;
  for (int na : nas) {
    auto rows_dot = [&](int64_t rows) {
      for (int64_t i = 0; i < rows; ++i)
        for (int j0 = 0; j0 < na; j0 += cpu::kMaxNa) {
          const int nn = std::min(cpu::kMaxNa, na - j0);
          mk.dot[id][nn - 1](k, w.data() + static_cast<size_t>(i) * row_bytes, ar.data() + rab * j0, rab, out);
          sink += out[0];
        }
    };
    // mode 0: gemm8; 1: pack + tile_dot 4 rows per call; 2: pack + tile_dot8 where 8 rows remain;
    // 3: wide 16-row tiles (pack + wtile_dot, 8 rows per call).
    const auto wpack = t16 ? nullptr : mk.wtile_pack[id];
    std::vector<uint8_t> wtile(static_cast<size_t>(k / 32) * cpu::kWideTileBlockBytes);
    float wout[cpu::kGemmMaxNa * cpu::kWideTileRows];
    auto wide_rows = [&](int64_t rows) {
      for (int64_t i = 0; i < rows; i += cpu::kWideTileRows) {
        const uint8_t* rp[cpu::kWideTileRows];
        for (int r = 0; r < cpu::kWideTileRows; ++r) rp[r] = w.data() + static_cast<size_t>(i + r) * row_bytes;
        wpack(rp, cpu::kWideTileRows, k, wtile.data());
        for (int j0 = 0, nn = 0; j0 < na; j0 += nn) {
          nn = std::min(cpu::kGemmMaxNa, na - j0);
          mk.wtile_dot[nn - 1](k, wtile.data(), at.data() + tab * j0, tab, wout);
          sink += wout[0];
        }
      }
    };
    alignas(64) float gout[cpu::kWideGemmMaxNa * cpu::kWideTileRows];
    auto wgemm_rows = [&](int64_t rows) {
      for (int64_t i = 0; i < rows; i += cpu::kWideTileRows) {
        const uint8_t* rp[cpu::kWideTileRows];
        for (int r = 0; r < cpu::kWideTileRows; ++r) rp[r] = w.data() + static_cast<size_t>(i + r) * row_bytes;
        for (int j0 = 0, nn = 0; j0 < na; j0 += nn) {
          nn = std::min(cpu::kWideGemmMaxNa, na - j0);
          mk.wgemm[id](rp, cpu::kWideTileRows, k, at.data() + tab * j0, tab, nn, gout);
          sink += gout[0];
        }
      }
    };
    auto tile_rows = [&](int64_t rows, int mode) {
      for (int64_t i = 0; i < rows; i += cpu::kTileRows) {
        const uint8_t* rp[cpu::kTileRows];
        for (int r = 0; r < cpu::kTileRows; ++r) rp[r] = w.data() + static_cast<size_t>(i + r) * row_bytes;
        if (mode != 0) tk.pack(rp, cpu::kTileRows, k, tile.data());
        for (int j0 = 0, nn = 0; j0 < na; j0 += nn) {
          if (mode == 0) {
            nn = std::min(cpu::kGemmMaxNa, na - j0);
            mk.gemm8[id](rp, cpu::kTileRows, k, at.data() + tab * j0, tab, nn, out);
          } else if (mode == 2 && na - j0 >= 8 && tk.dot8 != nullptr) {
            nn = 8;
            tk.dot8(k, tile.data(), at.data() + tab * j0, tab, out);
          } else {
            nn = std::min(cpu::kMaxNa, na - j0);
            tk.dot[nn - 1](k, tile.data(), at.data() + tab * j0, tab, out);
          }
          sink += out[0];
        }
      }
    };
    std::printf("%-6s %-6s k=%lld na=%-3d", level, std::string(tr.name).c_str(), static_cast<long long>(k), na);
    for (bool cold : {false, true}) {
      const int64_t rows = cold ? cold_rows / 8 * 8 : hot_rows;
      std::printf(" | %s dots %6.2f", cold ? "dram" : "hot", run_rows(rows_dot, row_bytes, rows, 0.2));
      if (mk.gemm8[id] != nullptr)
        std::printf(" gemm8 %6.2f", run_rows([&](int64_t r) { tile_rows(r, 0); }, row_bytes, rows, 0.2));
      if (tk.pack != nullptr)
        std::printf(" tiles %6.2f", run_rows([&](int64_t r) { tile_rows(r, 1); }, row_bytes, rows, 0.2));
      if (tk.pack != nullptr && na >= 8)
        std::printf(" tiles8 %6.2f", run_rows([&](int64_t r) { tile_rows(r, 2); }, row_bytes, rows, 0.2));
      if (wpack != nullptr)
        std::printf(" wide %6.2f", run_rows(wide_rows, row_bytes, rows / 16 * 16, 0.2));
      if (mk.wgemm[id] != nullptr)
        std::printf(" wgemm %6.2f", run_rows(wgemm_rows, row_bytes, rows / 16 * 16, 0.2));
    }
    std::printf(" GB/s\n");
    std::fflush(stdout);
  }
  if (sink == 12345.f) std::printf(" ");
}

}  // namespace

int main(int argc, char** argv) {
  std::string types = "q4_0,q8_0,q4_K,q6_K";
  int64_t k = 2048;
  std::vector<int> nas;
  std::string only_level;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--types" && i + 1 < argc) types = argv[++i];
    else if (a == "--k" && i + 1 < argc) k = std::atoll(argv[++i]);
    else if (a == "--level" && i + 1 < argc) only_level = argv[++i];
    else if (a == "--na" && i + 1 < argc) {
      for (const char* p = argv[++i]; *p != 0;) {
        nas.push_back(std::atoi(p));
        while (*p != 0 && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    }
    else {
      std::fprintf(stderr, "usage: kite-decode-kernels [--types t1,t2] [--k K] [--na 1,2,4,8,16] [--level avx2|avxvnni|avx512]\n");
      return 2;
    }
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  if (nas.empty()) nas = {1, 2, 4, 8, 16};
  std::vector<float> x(static_cast<size_t>(4 * k));
  for (float& v : x) v = nd(rng);
  size_t start = 0;
  while (start < types.size()) {
    size_t end = types.find(',', start);
    if (end == std::string::npos) end = types.size();
    const std::string name = types.substr(start, end - start);
    start = end + 1;
    const quant::TypeTraits* tr = quant::find_traits(name);
    if (tr == nullptr || tr->quantize == nullptr) {
      std::fprintf(stderr, "unknown type %s\n", name.c_str());
      return 2;
    }
    const size_t row_bytes = static_cast<size_t>(k / tr->block_size) * tr->type_size;
    // One quantized row copied to fill 512 MiB (cold) / 256 KiB (hot).
    std::vector<uint8_t> row(row_bytes);
    tr->quantize(x.data(), row.data(), k);
    const int64_t cold_rows = static_cast<int64_t>((512u << 20) / row_bytes), hot_rows = static_cast<int64_t>((256u << 10) / row_bytes) + 1;
    std::vector<uint8_t> w(static_cast<size_t>(cold_rows) * row_bytes);
    for (int64_t i = 0; i < cold_rows; ++i) std::memcpy(w.data() + static_cast<size_t>(i) * row_bytes, row.data(), row_bytes);
    for (cpu::SimdLevel level : cpu::supported_simd_levels()) {
      const cpu::MatmulKernels* mk = cpu::matmul_kernels_for(level);
      if (mk == nullptr) continue;
      const char* level_name = cpu::simd_level_name(level);
      if (!only_level.empty() && only_level != level_name) continue;
      const cpu::ActFormat f = cpu::act_format(static_cast<DType>(tr->type));
      std::vector<uint8_t> act(cpu::act_row_bytes(f, k) + 64);
      if (f == cpu::ActFormat::kQ8K) mk->quantize_q8k(x.data(), act.data(), k);
      else mk->quantize_q8(x.data(), act.data(), k);
      // One row kernel over the same weights, hot in cache and streamed from DRAM.
      auto measure = [&](const char* label, cpu::VecDotFn fn, const uint8_t* a) {
        float r = 0.f;
        fn(k, row.data(), a, 0, &r);
        const double hot = run(fn, w.data(), row_bytes, hot_rows, k, a, 0.3);
        const double cold = run(fn, w.data(), row_bytes, cold_rows, k, a, 0.3);
        std::printf("%-6s %-6s k=%lld  %shot %6.2f GB/s (%5.2f ns/block)  dram %6.2f GB/s  dot=%g\n", level_name,
                    name.c_str(), static_cast<long long>(k), label, hot, static_cast<double>(tr->type_size) / hot, cold,
                    static_cast<double>(r));
      };
      measure("", mk->dot[static_cast<size_t>(tr->type)][0], act.data());
      // The one-row kernel mul_mat uses for decode where the level has one.
      if (const cpu::VecDotFn gemv = mk->gemv[static_cast<size_t>(tr->type)]; gemv != nullptr) {
        const cpu::ActFormat gf = cpu::gemv_act_format(static_cast<DType>(tr->type));
        std::vector<uint8_t> actg(cpu::act_row_bytes(gf, k) + 64);
        (gf == cpu::ActFormat::kQ8KG ? mk->quantize_q8kg : mk->quantize_q8g)(x.data(), actg.data(), k);
        measure("gemv ", gemv, actg.data());
        if (const auto gemv4 = mk->gemv4[static_cast<size_t>(tr->type)]; gemv4 != nullptr) {
          float r4[4] = {}, r1 = 0.f;
          gemv4(k, row.data(), 0, nullptr, actg.data(), r4);
          gemv(k, row.data(), actg.data(), 0, &r1);
          auto rows4 = [&](int64_t rows) {
            float o[4];
            for (int64_t i = 0; i + 4 <= rows; i += 4) {
              const uint8_t* p = w.data() + static_cast<size_t>(i) * row_bytes;
              gemv4(k, p, row_bytes, i + 8 <= rows ? p + 4 * row_bytes : nullptr, actg.data(), o);
              r4[0] += o[0];
            }
          };
          const double hot = run_rows(rows4, row_bytes, hot_rows / 4 * 4, 0.3);
          const double cold = run_rows(rows4, row_bytes, cold_rows / 4 * 4, 0.3);
          std::printf("%-6s %-6s k=%lld  gemv4 hot %6.2f GB/s (%5.2f ns/block)  dram %6.2f GB/s  %s gemv's\n",
                      level_name, name.c_str(), static_cast<long long>(k), hot,
                      static_cast<double>(tr->type_size) / hot, cold,
                      std::memcmp(&r1, &r4[1], sizeof r1) == 0 ? "same bits as" : "DIFFERENT bits from");
        }
      }
      bench_batches(*mk, level_name, *tr, k, x, w, row_bytes, cold_rows, nas);
    }
  }
  return 0;
}
