// mul_mat kernels for base Armv8 Advanced SIMD (NEON; every aarch64 CPU). See matmul_neon.inc.
#define KITE_NEON_DOT 0
#include "backends/cpu/matmul_neon.inc"

namespace kite::cpu {

const MatmulKernels& matmul_kernels_neon() {
  static const MatmulKernels k = make_kernels();
  return k;
}

}  // namespace kite::cpu
