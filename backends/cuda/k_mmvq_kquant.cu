// Int8 matrix-vector instances for the 256-element super-block types (Q2_K..Q6_K, IQ4_XS).
#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

namespace {
using Family = MmvqFamily<kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kIQ4_XS>;  // (this file's types)
}  // namespace

cudaError_t launch_mmvq_kquant(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                               cudaStream_t s) {
  return Family::launch(type, job, k, q, ds, n, s);
}

cudaError_t launch_mmvq_id_kquant(int type, const MatVecIdArgs& a, cudaStream_t s) {
  return Family::launch_id(type, a, s);
}

}  // namespace kite::cuda
