// mul_mat kernels for AVX2 + FMA + F16C + AVX-VNNI (compiled with -mavx2 -mfma -mf16c -mavxvnni;
// see matmul_x86.inc): the AVX2 level's 256-bit kernels with vpdpbusd in their integer dots,
// for the CPUs that have AVX-VNNI but no AVX-512 (Intel client cores from Alder Lake on).
#define KITE_VNNI 1
#define KITE_WIDE 0
#include "backends/cpu/matmul_x86.inc"

namespace kite::cpu {

const MatmulKernels& matmul_kernels_avxvnni() {
  static const MatmulKernels k = make_kernels();
  return k;
}

}  // namespace kite::cpu
