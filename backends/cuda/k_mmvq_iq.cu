// Int8 matrix-vector instances for the codebook types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S).
#include <type_traits>

#include "backends/cuda/mmvq.cuh"

namespace kite::cuda {

namespace {

// f(integral_constant<int, T>) for this family's type T.
template <class F>
cudaError_t with_type(int type, F&& f) {
  switch (type) {
    case kIQ2_XXS: return f(std::integral_constant<int, kIQ2_XXS>{});
    case kIQ2_XS: return f(std::integral_constant<int, kIQ2_XS>{});
    case kIQ2_S: return f(std::integral_constant<int, kIQ2_S>{});
    case kIQ3_XXS: return f(std::integral_constant<int, kIQ3_XXS>{});
    case kIQ3_S: return f(std::integral_constant<int, kIQ3_S>{});
    case kIQ1_S: return f(std::integral_constant<int, kIQ1_S>{});
    case kIQ1_M: return f(std::integral_constant<int, kIQ1_M>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_mmvq_iq(int type, const MatVecJob& job, int64_t k, const int8_t* q, const float* ds, int n,
                           cudaStream_t s) {
  return with_type(type, [&](auto t) { return launch_mmvq_t<decltype(t)::value>(job, k, q, ds, n, s); });
}

cudaError_t launch_mmvq_id_iq(int type, const MatVecIdArgs& a, cudaStream_t s) {
  return with_type(type, [&](auto t) { return launch_mmvq_id_t<decltype(t)::value>(a, s); });
}

}  // namespace kite::cuda
