// Int8 matrix-vector instances for the 256-element super-block types (Q2_K..Q6_K, IQ4_XS).
#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

cudaError_t launch_mmvq_kquant(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                               cudaStream_t s) {
  switch (type) {
    case kQ2_K: return launch_mmvq_t<kQ2_K>(job, k, q, ds, n, s);
    case kQ3_K: return launch_mmvq_t<kQ3_K>(job, k, q, ds, n, s);
    case kQ4_K: return launch_mmvq_t<kQ4_K>(job, k, q, ds, n, s);
    case kQ5_K: return launch_mmvq_t<kQ5_K>(job, k, q, ds, n, s);
    case kQ6_K: return launch_mmvq_t<kQ6_K>(job, k, q, ds, n, s);
    case kIQ4_XS: return launch_mmvq_t<kIQ4_XS>(job, k, q, ds, n, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kite::cuda
