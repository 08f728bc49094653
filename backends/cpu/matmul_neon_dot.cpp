// mul_mat kernels for NEON + the dot-product extension (SDOT). Compiled with
// -march=armv8.2-a+dotprod (GCC's SDOT intrinsics need v8.2; the extension exists only on v8.2+
// cores) and used only where getauxval reports HWCAP_ASIMDDP. See matmul_neon.inc.
#define KITE_NEON_DOT 1
#include "backends/cpu/matmul_neon.inc"

namespace kite::cpu {

const MatmulKernels& matmul_kernels_neon_dot() {
  static const MatmulKernels k = make_kernels();
  return k;
}

}  // namespace kite::cpu
