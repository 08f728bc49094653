// Int8 matrix-vector instances for the 256-element super-block types (Q2_K..Q6_K, IQ4_XS).
#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

cudaError_t launch_mmvq_kquant(int type, const void* w, size_t row_bytes, int64_t k, int64_t m, const int8_t* q,
                               const float* ds, int n, float* dst, int64_t ldd, cudaStream_t s) {
  switch (type) {
    case kQ2_K: return launch_mmvq_t<kQ2_K>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    case kQ3_K: return launch_mmvq_t<kQ3_K>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    case kQ4_K: return launch_mmvq_t<kQ4_K>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    case kQ5_K: return launch_mmvq_t<kQ5_K>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    case kQ6_K: return launch_mmvq_t<kQ6_K>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    case kIQ4_XS: return launch_mmvq_t<kIQ4_XS>(w, row_bytes, k, m, q, ds, n, dst, ldd, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kite::cuda
