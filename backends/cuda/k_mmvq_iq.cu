// Int8 matrix-vector instances for the codebook types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S).
#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

namespace {
using Family = MmvqFamily<kIQ2_XXS, kIQ2_XS, kIQ2_S, kIQ3_XXS, kIQ3_S, kIQ1_S, kIQ1_M>;  // (this file's types)
}  // namespace

cudaError_t launch_mmvq_iq(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                           cudaStream_t s) {
  return Family::launch(type, job, k, q, ds, n, s);
}

cudaError_t launch_mmvq_id_iq(int type, const MatVecIdArgs& a, cudaStream_t s) {
  return Family::launch_id(type, a, s);
}

}  // namespace kite::cuda
