// mul_mat kernels for AVX2 + FMA + F16C (compiled with -mavx2 -mfma -mf16c; see matmul_x86.inc).
#define KITE_VNNI 0
#define KITE_WIDE 0
#include "backends/cpu/matmul_x86.inc"

namespace kite::cpu {

const MatmulKernels& matmul_kernels_avx2() {
  static const MatmulKernels k = make_kernels();
  return k;
}

}  // namespace kite::cpu
