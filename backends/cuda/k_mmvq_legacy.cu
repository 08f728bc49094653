// Int8 matrix-vector instances for the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL).
#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

cudaError_t launch_mmvq_legacy(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                               cudaStream_t s) {
  switch (type) {
    case kQ4_0: return launch_mmvq_t<kQ4_0>(job, k, q, ds, n, s);
    case kQ4_1: return launch_mmvq_t<kQ4_1>(job, k, q, ds, n, s);
    case kQ5_0: return launch_mmvq_t<kQ5_0>(job, k, q, ds, n, s);
    case kQ5_1: return launch_mmvq_t<kQ5_1>(job, k, q, ds, n, s);
    case kQ8_0: return launch_mmvq_t<kQ8_0>(job, k, q, ds, n, s);
    case kIQ4_NL: return launch_mmvq_t<kIQ4_NL>(job, k, q, ds, n, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kite::cuda
