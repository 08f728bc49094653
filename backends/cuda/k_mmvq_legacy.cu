// Int8 matrix-vector instances for the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL).
#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

namespace {
using Family = MmvqFamily<kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kIQ4_NL>;  // (this file's types)
}  // namespace

cudaError_t launch_mmvq_legacy(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                               cudaStream_t s) {
  return Family::launch(type, job, k, q, ds, n, s);
}

cudaError_t launch_mmvq_id_legacy(int type, const MatVecIdArgs& a, cudaStream_t s) {
  return Family::launch_id(type, a, s);
}

}  // namespace kite::cuda
