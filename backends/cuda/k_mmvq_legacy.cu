// Int8 matrix-vector instances for the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL).
#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

cudaError_t launch_mmvq_legacy(int type, const void* w, size_t row_bytes, int64_t k, int64_t m, const int8_t* q,
                               const float* ds, int n, float* dst, int64_t ldd, cudaStream_t s) {
  switch (type) {
    case kQ4_0: return launch_mmvq_t<kQ4_0>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    case kQ4_1: return launch_mmvq_t<kQ4_1>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    case kQ5_0: return launch_mmvq_t<kQ5_0>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    case kQ5_1: return launch_mmvq_t<kQ5_1>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    case kQ8_0: return launch_mmvq_t<kQ8_0>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    case kIQ4_NL: return launch_mmvq_t<kIQ4_NL>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kite::cuda
