// Int8 matrix-vector instances for the 256-element super-block types (Q2_K..Q6_K, IQ4_XS).
#include <type_traits>

#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

namespace {

// f(integral_constant<int, T>) for this family's type T.
template <class F>
cudaError_t with_type(int type, F&& f) {
  switch (type) {
    case kQ2_K: return f(std::integral_constant<int, kQ2_K>{});
    case kQ3_K: return f(std::integral_constant<int, kQ3_K>{});
    case kQ4_K: return f(std::integral_constant<int, kQ4_K>{});
    case kQ5_K: return f(std::integral_constant<int, kQ5_K>{});
    case kQ6_K: return f(std::integral_constant<int, kQ6_K>{});
    case kIQ4_XS: return f(std::integral_constant<int, kIQ4_XS>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_mmvq_kquant(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                               cudaStream_t s) {
  return with_type(type, [&](auto t) { return launch_mmvq_t<decltype(t)::value>(job, k, q, ds, n, s); });
}

cudaError_t launch_mmvq_id_kquant(int type, const MatVecIdArgs& a, cudaStream_t s) {
  return with_type(type, [&](auto t) { return launch_mmvq_id_t<decltype(t)::value>(a, s); });
}

}  // namespace kite::cuda
