// Int8 matrix-vector instances for the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL).
#include <type_traits>

#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

namespace {

// f(integral_constant<int, T>) for this family's type T.
template <class F>
cudaError_t with_type(int type, F&& f) {
  switch (type) {
    case kQ4_0: return f(std::integral_constant<int, kQ4_0>{});
    case kQ4_1: return f(std::integral_constant<int, kQ4_1>{});
    case kQ5_0: return f(std::integral_constant<int, kQ5_0>{});
    case kQ5_1: return f(std::integral_constant<int, kQ5_1>{});
    case kQ8_0: return f(std::integral_constant<int, kQ8_0>{});
    case kIQ4_NL: return f(std::integral_constant<int, kIQ4_NL>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_mmvq_legacy(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                               cudaStream_t s) {
  return with_type(type, [&](auto t) { return launch_mmvq_t<decltype(t)::value>(job, k, q, ds, n, s); });
}

cudaError_t launch_mmvq_id_legacy(int type, const MatVecIdArgs& a, cudaStream_t s) {
  return with_type(type, [&](auto t) { return launch_mmvq_id_t<decltype(t)::value>(a, s); });
}

}  // namespace kite::cuda
