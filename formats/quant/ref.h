// kite/formats/quant/ref.h — the scalar reference routines behind the type table (internal).
//
// Signatures follow quant::DequantizeFn / QuantizeFn: `n` is a whole number of blocks and the
// quantizers' input is finite and within the type's range (types.cpp checks before calling).
#pragma once

#include <cstdint>

namespace kite::quant::ref {

#define KITE_QUANT_REF_TYPE(name)                              \
  void dequantize_##name(const void* src, float* dst, int64_t n); \
  void quantize_##name(const float* src, void* dst, int64_t n);

KITE_QUANT_REF_TYPE(f32)
KITE_QUANT_REF_TYPE(f16)
KITE_QUANT_REF_TYPE(bf16)
KITE_QUANT_REF_TYPE(q4_0)
KITE_QUANT_REF_TYPE(q4_1)
KITE_QUANT_REF_TYPE(q5_0)
KITE_QUANT_REF_TYPE(q5_1)
KITE_QUANT_REF_TYPE(q8_0)
KITE_QUANT_REF_TYPE(q8_1)
KITE_QUANT_REF_TYPE(q2_k)
KITE_QUANT_REF_TYPE(q3_k)
KITE_QUANT_REF_TYPE(q4_k)
KITE_QUANT_REF_TYPE(q5_k)
KITE_QUANT_REF_TYPE(q6_k)
KITE_QUANT_REF_TYPE(q8_k)
KITE_QUANT_REF_TYPE(iq4_nl)
KITE_QUANT_REF_TYPE(iq4_xs)

// The codebook types: decoders in ref_iq_codebook.cpp, quantizers in ref_iq_codebook_quant.cpp.
KITE_QUANT_REF_TYPE(iq2_xxs)
KITE_QUANT_REF_TYPE(iq2_xs)
KITE_QUANT_REF_TYPE(iq2_s)
KITE_QUANT_REF_TYPE(iq3_xxs)
KITE_QUANT_REF_TYPE(iq3_s)
KITE_QUANT_REF_TYPE(iq1_s)
KITE_QUANT_REF_TYPE(iq1_m)

// Weighted variants: minimize sum w[i] * (x[i] - y[i])^2 (w: n weights >= 0; nullptr gives the
// unweighted quantizer's bytes).
#define KITE_QUANT_REF_WEIGHTED(name) void quantize_##name##_w(const float* src, void* dst, int64_t n, const float* w);

KITE_QUANT_REF_WEIGHTED(q4_0)
KITE_QUANT_REF_WEIGHTED(q4_1)
KITE_QUANT_REF_WEIGHTED(q5_0)
KITE_QUANT_REF_WEIGHTED(q5_1)
KITE_QUANT_REF_WEIGHTED(q2_k)
KITE_QUANT_REF_WEIGHTED(q3_k)
KITE_QUANT_REF_WEIGHTED(q4_k)
KITE_QUANT_REF_WEIGHTED(q5_k)
KITE_QUANT_REF_WEIGHTED(q6_k)
KITE_QUANT_REF_WEIGHTED(iq4_nl)
KITE_QUANT_REF_WEIGHTED(iq4_xs)
KITE_QUANT_REF_WEIGHTED(iq2_xxs)
KITE_QUANT_REF_WEIGHTED(iq2_xs)
KITE_QUANT_REF_WEIGHTED(iq2_s)
KITE_QUANT_REF_WEIGHTED(iq3_xxs)
KITE_QUANT_REF_WEIGHTED(iq3_s)
KITE_QUANT_REF_WEIGHTED(iq1_s)
KITE_QUANT_REF_WEIGHTED(iq1_m)

#undef KITE_QUANT_REF_WEIGHTED
#undef KITE_QUANT_REF_TYPE

}  // namespace kite::quant::ref
