// kite/backends/cpu/cpu_features.h — run-time CPU feature detection and the SIMD level in use.
//
// Kernels for each instruction-set level live in their own source file compiled with that
// level's target flags (backends/CMakeLists.txt); nothing else is built with them, so the
// binary runs on any x86-64 (or any aarch64) and picks its kernels here at run time. The scalar
// kernels are always available and are the reference the others are tested against.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kite::cpu {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false;
  bool avx512vnni = false, avx512bf16 = false, avx_vnni = false;
  bool neon = false, dotprod = false;  // aarch64: Advanced SIMD; the Armv8.2 SDOT/UDOT extension
  std::string describe() const;  // "avx2 fma f16c avx512f ..."
};

// Detected once (x86: cpuid via the compiler's builtins; aarch64 Linux: getauxval(AT_HWCAP)).
const CpuFeatures& cpu_features();

// Kernel levels; within one architecture, in increasing order.
//   kScalar:  the reference (dequantize to f32, scalar dot); any CPU.
//   kAvx2:    x86-64: AVX2 + FMA + F16C (maddubs/madd int8 dot products).
//   kAvxVnni: x86-64: kAvx2 + AVX-VNNI (256-bit vpdpbusd, VEX): Intel client CPUs from Alder
//             Lake on, which have no AVX-512; the same 256-bit kernels as kAvx2 otherwise.
//   kAvx512:  x86-64: AVX-512 F/BW/VL + AVX512-VNNI (vpdpbusd, 512-bit float dots).
//   kNeon:    aarch64: Advanced SIMD (smull/sadalp int8 dot products); every aarch64 CPU.
//   kNeonDot: aarch64: kNeon + the dot-product extension (sdot; HWCAP_ASIMDDP).
enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvxVnni = 2, kAvx512 = 3, kNeon = 4, kNeonDot = 5 };

const char* simd_level_name(SimdLevel l);
bool parse_simd_level(std::string_view s, SimdLevel* out);
// The best level this CPU (and this build) supports.
SimdLevel best_simd_level();
// Every level this CPU supports, lowest first (always includes kScalar).
std::vector<SimdLevel> supported_simd_levels();

// The level kernels use now: a forced level (tests, benchmarks) if set, else KITE_CPU_SCALAR=1
// -> kScalar, else KITE_CPU_SIMD=<name> if supported, else best_simd_level(). Read on each op
// (a relaxed atomic load), so forcing takes effect for the next op.
SimdLevel active_simd_level();
// Forces a level, clamped to what the CPU supports: an unsupported level steps down within its
// architecture (avx512 -> avxvnni -> avx2 -> scalar, neondot -> neon -> scalar); a level of another
// architecture means best_simd_level(). reset_simd_level() undoes it.
void force_simd_level(SimdLevel l);
void reset_simd_level();

}  // namespace kite::cpu
