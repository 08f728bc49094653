// Int8 matrix-vector instances for the codebook types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S).
#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

cudaError_t launch_mmvq_iq(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                           cudaStream_t s) {
  switch (type) {
    case kIQ2_XXS: return launch_mmvq_t<kIQ2_XXS>(job, k, q, ds, n, s);
    case kIQ2_XS: return launch_mmvq_t<kIQ2_XS>(job, k, q, ds, n, s);
    case kIQ2_S: return launch_mmvq_t<kIQ2_S>(job, k, q, ds, n, s);
    case kIQ3_XXS: return launch_mmvq_t<kIQ3_XXS>(job, k, q, ds, n, s);
    case kIQ3_S: return launch_mmvq_t<kIQ3_S>(job, k, q, ds, n, s);
    case kIQ1_S: return launch_mmvq_t<kIQ1_S>(job, k, q, ds, n, s);
    case kIQ1_M: return launch_mmvq_t<kIQ1_M>(job, k, q, ds, n, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kite::cuda
