#include "backends/cpu/cpu_features.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace kite::cpu {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  // F16C, AVX512-BF16 and AVX-VNNI are not known to every compiler's builtin: ask cpuid.
  unsigned a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  f.f16c = (c >> 29) & 1u;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  if (a >= 7) {
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    f.avx_vnni = (a >> 4) & 1u;
    f.avx512bf16 = (a >> 5) & 1u;
  }
  // The OS must save the wide registers (XCR0): YMM for AVX2, ZMM/opmask for AVX-512.
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  uint64_t xcr0 = 0;
  if ((c >> 27) & 1u) {  // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;
  if (!ymm) f.avx2 = f.fma = f.f16c = f.avx_vnni = false;
  if (!zmm) f.avx512f = f.avx512bw = f.avx512vl = f.avx512vnni = f.avx512bf16 = false;
#elif defined(__aarch64__)
  f.neon = true;  // Advanced SIMD is part of the aarch64 base architecture
#if defined(__linux__)
  const unsigned long hwcap = getauxval(AT_HWCAP);
  f.neon = (hwcap & HWCAP_ASIMD) != 0;
  f.dotprod = (hwcap & HWCAP_ASIMDDP) != 0;
#endif
#endif
  return f;
}

bool level_supported(SimdLevel l) {
  [[maybe_unused]] const CpuFeatures& f = cpu_features();
  switch (l) {
    case SimdLevel::kScalar: return true;
#if defined(KITE_CPU_X86_KERNELS)
    case SimdLevel::kAvx2: return f.avx2 && f.fma && f.f16c;
    case SimdLevel::kAvxVnni: return f.avx2 && f.fma && f.f16c && f.avx_vnni;
    case SimdLevel::kAvx512:
      return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
#endif
#if defined(KITE_CPU_ARM_KERNELS)
    case SimdLevel::kNeon: return f.neon;
    case SimdLevel::kNeonDot: return f.neon && f.dotprod;
#endif
    default: return false;
  }
  return false;
}

// All levels, lowest first within each architecture.
constexpr SimdLevel kAllLevels[] = {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvxVnni,
                                    SimdLevel::kAvx512, SimdLevel::kNeon, SimdLevel::kNeonDot};

// The next lower level of the same architecture (kScalar below the lowest).
SimdLevel level_below(SimdLevel l) {
  switch (l) {
    case SimdLevel::kAvx512: return SimdLevel::kAvxVnni;
    case SimdLevel::kAvxVnni: return SimdLevel::kAvx2;
    case SimdLevel::kNeonDot: return SimdLevel::kNeon;
    default: return SimdLevel::kScalar;
  }
}

[[maybe_unused]] bool is_x86_level(SimdLevel l) {
  return l == SimdLevel::kAvx2 || l == SimdLevel::kAvxVnni || l == SimdLevel::kAvx512;
}
[[maybe_unused]] bool is_arm_level(SimdLevel l) { return l == SimdLevel::kNeon || l == SimdLevel::kNeonDot; }

// Whether l is a level of the architecture this binary runs on (kScalar is of every one).
bool native_architecture(SimdLevel l) {
#if defined(__x86_64__) || defined(__i386__)
  return !is_arm_level(l);
#elif defined(__aarch64__)
  return !is_x86_level(l);
#else
  return l == SimdLevel::kScalar;
#endif
}

constexpr int kNotForced = -1;
std::atomic<int> g_forced{kNotForced};

SimdLevel env_level() {
  const char* scalar = std::getenv("KITE_CPU_SCALAR");
  if (scalar != nullptr && scalar[0] == '1') return SimdLevel::kScalar;
  const char* name = std::getenv("KITE_CPU_SIMD");
  SimdLevel l;
  if (name != nullptr && parse_simd_level(name, &l) && level_supported(l)) return l;
  return best_simd_level();
}

}  // namespace

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(avx_vnni, "avxvnni");
  add(neon, "neon");
  add(dotprod, "asimddp");
  return s.empty() ? "none" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

const char* simd_level_name(SimdLevel l) {
  switch (l) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvxVnni: return "avxvnni";
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kNeon: return "neon";
    case SimdLevel::kNeonDot: return "neondot";
  }
  return "?";
}

bool parse_simd_level(std::string_view s, SimdLevel* out) {
  for (SimdLevel l : kAllLevels) {
    if (s == simd_level_name(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

SimdLevel best_simd_level() {
  static const SimdLevel best = [] {
    SimdLevel b = SimdLevel::kScalar;
    for (SimdLevel l : kAllLevels)
      if (level_supported(l)) b = l;
    return b;
  }();
  return best;
}

std::vector<SimdLevel> supported_simd_levels() {
  std::vector<SimdLevel> v;
  for (SimdLevel l : kAllLevels)
    if (level_supported(l)) v.push_back(l);
  return v;
}

SimdLevel active_simd_level() {
  const int f = g_forced.load(std::memory_order_relaxed);
  if (f != kNotForced) return static_cast<SimdLevel>(f);
  static const SimdLevel from_env = env_level();
  return from_env;
}

void force_simd_level(SimdLevel l) {
  if (!native_architecture(l)) l = best_simd_level();
  while (!level_supported(l)) l = level_below(l);
  g_forced.store(static_cast<int>(l), std::memory_order_relaxed);
}

void reset_simd_level() { g_forced.store(kNotForced, std::memory_order_relaxed); }

}  // namespace kite::cpu
