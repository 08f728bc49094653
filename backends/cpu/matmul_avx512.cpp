// mul_mat kernels for AVX-512 F/BW/VL + VNNI (vpdpbusd on 256-bit vectors, 512-bit float dots;
// see matmul_x86.inc). Compiled with its own target flags; only called when the CPU has them.
#define KITE_VNNI 1
#define KITE_WIDE 1
#include "backends/cpu/matmul_x86.inc"

namespace kite::cpu {

const MatmulKernels& matmul_kernels_avx512() {
  static const MatmulKernels k = make_kernels();
  return k;
}

}  // namespace kite::cpu
