#include "formats/quant/types.h"

#include <array>
#include <cctype>
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "formats/quant/ref.h"

namespace kite::quant {
namespace {

// ggml's table: id, name, elements per block, bytes per block. Ids missing here (4, 5, 31-33,
// 36-38) were removed from ggml and never appear in files that current llama.cpp reads.
// (Ids and sizes checked against ggml-common.h / ggml.c's type_traits.)
constexpr TypeTraits kTraits[] = {
    {Type::F32, "f32", 1, 4, false, ref::dequantize_f32, ref::quantize_f32},
    {Type::F16, "f16", 1, 2, false, ref::dequantize_f16, ref::quantize_f16},
    {Type::Q4_0, "q4_0", 32, 18, true, ref::dequantize_q4_0, ref::quantize_q4_0},
    {Type::Q4_1, "q4_1", 32, 20, true, ref::dequantize_q4_1, ref::quantize_q4_1},
    {Type::Q5_0, "q5_0", 32, 22, true, ref::dequantize_q5_0, ref::quantize_q5_0},
    {Type::Q5_1, "q5_1", 32, 24, true, ref::dequantize_q5_1, ref::quantize_q5_1},
    {Type::Q8_0, "q8_0", 32, 34, true, ref::dequantize_q8_0, ref::quantize_q8_0},
    {Type::Q8_1, "q8_1", 32, 36, true, ref::dequantize_q8_1, ref::quantize_q8_1},
    {Type::Q2_K, "q2_K", 256, 84, true, ref::dequantize_q2_k, ref::quantize_q2_k},
    {Type::Q3_K, "q3_K", 256, 110, true, ref::dequantize_q3_k, ref::quantize_q3_k},
    {Type::Q4_K, "q4_K", 256, 144, true, ref::dequantize_q4_k, ref::quantize_q4_k},
    {Type::Q5_K, "q5_K", 256, 176, true, ref::dequantize_q5_k, ref::quantize_q5_k},
    {Type::Q6_K, "q6_K", 256, 210, true, ref::dequantize_q6_k, ref::quantize_q6_k},
    {Type::Q8_K, "q8_K", 256, 292, true, ref::dequantize_q8_k, ref::quantize_q8_k},
    {Type::IQ2_XXS, "iq2_xxs", 256, 66, true, ref::dequantize_iq2_xxs, ref::quantize_iq2_xxs},
    {Type::IQ2_XS, "iq2_xs", 256, 74, true, ref::dequantize_iq2_xs, ref::quantize_iq2_xs},
    {Type::IQ3_XXS, "iq3_xxs", 256, 98, true, ref::dequantize_iq3_xxs, ref::quantize_iq3_xxs},
    {Type::IQ1_S, "iq1_s", 256, 50, true, ref::dequantize_iq1_s, ref::quantize_iq1_s},
    {Type::IQ4_NL, "iq4_nl", 32, 18, true, ref::dequantize_iq4_nl, ref::quantize_iq4_nl},
    {Type::IQ3_S, "iq3_s", 256, 110, true, ref::dequantize_iq3_s, ref::quantize_iq3_s},
    {Type::IQ2_S, "iq2_s", 256, 82, true, ref::dequantize_iq2_s, ref::quantize_iq2_s},
    {Type::IQ4_XS, "iq4_xs", 256, 136, true, ref::dequantize_iq4_xs, ref::quantize_iq4_xs},
    {Type::I8, "i8", 1, 1, false, nullptr, nullptr},
    {Type::I16, "i16", 1, 2, false, nullptr, nullptr},
    {Type::I32, "i32", 1, 4, false, nullptr, nullptr},
    {Type::I64, "i64", 1, 8, false, nullptr, nullptr},
    {Type::F64, "f64", 1, 8, false, nullptr, nullptr},
    {Type::IQ1_M, "iq1_m", 256, 56, true, ref::dequantize_iq1_m, ref::quantize_iq1_m},
    {Type::BF16, "bf16", 1, 2, false, ref::dequantize_bf16, ref::quantize_bf16},
    {Type::TQ1_0, "tq1_0", 256, 54, true, nullptr, nullptr},
    {Type::TQ2_0, "tq2_0", 256, 66, true, nullptr, nullptr},
    {Type::MXFP4, "mxfp4", 32, 17, true, nullptr, nullptr},
};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

}  // namespace

const TypeTraits* find_traits(uint32_t type_id) {
  for (const auto& t : kTraits)
    if (static_cast<uint32_t>(t.type) == type_id) return &t;
  return nullptr;
}

const TypeTraits* find_traits(std::string_view name) {
  for (const auto& t : kTraits)
    if (iequals(t.name, name)) return &t;
  return nullptr;
}

Result<size_t> row_size(Type t, int64_t n) {
  const TypeTraits* tr = find_traits(t);
  if (tr == nullptr) return make_error("unknown tensor type id ", static_cast<uint32_t>(t));
  if (n < 0 || n % tr->block_size != 0)
    return make_error("a row of ", n, " elements is not a whole number of ", tr->name, " blocks (",
                      tr->block_size, " elements each)");
  return static_cast<size_t>(n / tr->block_size) * tr->type_size;
}

bool can_dequantize(Type t) {
  const TypeTraits* tr = find_traits(t);
  return tr != nullptr && tr->dequantize != nullptr;
}

bool can_quantize(Type t) {
  const TypeTraits* tr = find_traits(t);
  return tr != nullptr && tr->quantize != nullptr;
}

float max_quantizable(Type t) {
  // Types whose values or scales are stored as halves cannot represent more than the largest
  // half; F32, BF16 and Q8_K (float scale) take any finite value.
  switch (t) {
    case Type::F32:
    case Type::BF16:
    case Type::Q8_K:
      return std::numeric_limits<float>::max();
    default:
      return 65504.0f;
  }
}

Status dequantize_row(Type t, const void* src, float* dst, int64_t n) {
  KITE_ASSIGN_OR_RETURN(size_t bytes, row_size(t, n));
  (void)bytes;
  const TypeTraits* tr = find_traits(t);
  if (tr->dequantize == nullptr) return make_error("cannot dequantize type ", tr->name);
  tr->dequantize(src, dst, n);
  return ok_status();
}

namespace {

// quantize_row's checks: a type kite can produce, whole blocks, finite values within range.
Status check_quantizable(Type t, const float* src, int64_t n) {
  KITE_ASSIGN_OR_RETURN(size_t bytes, row_size(t, n));
  (void)bytes;
  const TypeTraits* tr = find_traits(t);
  if (tr->quantize == nullptr) return make_error("cannot quantize to type ", tr->name);
  const float limit = max_quantizable(t);
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(src[i]))
      return make_error("cannot quantize to ", tr->name, ": element ", i, " is ", src[i], " (not finite)");
    if (std::fabs(src[i]) > limit)
      return make_error("cannot quantize to ", tr->name, ": element ", i, " is ", src[i],
                        ", beyond the type's range (|x| <= ", limit, ")");
  }
  return ok_status();
}

}  // namespace

Status quantize_row(Type t, const float* src, void* dst, int64_t n) {
  KITE_TRY(check_quantizable(t, src, n));
  find_traits(t)->quantize(src, dst, n);
  return ok_status();
}

Status quantize_rows(Type t, const float* src, void* dst, int64_t nrows, int64_t n_per_row) {
  if (nrows < 0) return make_error("cannot quantize ", nrows, " rows");
  KITE_ASSIGN_OR_RETURN(size_t bytes, row_size(t, n_per_row));
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t r = 0; r < nrows; ++r) {
    Status st = quantize_row(t, src + r * n_per_row, out + static_cast<size_t>(r) * bytes, n_per_row);
    if (!st) return st.error().with_context("row " + std::to_string(r));
  }
  return ok_status();
}

namespace {

using WeightedFn = void (*)(const float* src, void* dst, int64_t n, const float* w);

WeightedFn weighted_fn(Type t) {
  switch (t) {
    case Type::Q4_0: return ref::quantize_q4_0_w;
    case Type::Q4_1: return ref::quantize_q4_1_w;
    case Type::Q5_0: return ref::quantize_q5_0_w;
    case Type::Q5_1: return ref::quantize_q5_1_w;
    case Type::Q2_K: return ref::quantize_q2_k_w;
    case Type::Q3_K: return ref::quantize_q3_k_w;
    case Type::Q4_K: return ref::quantize_q4_k_w;
    case Type::Q5_K: return ref::quantize_q5_k_w;
    case Type::Q6_K: return ref::quantize_q6_k_w;
    case Type::IQ4_NL: return ref::quantize_iq4_nl_w;
    case Type::IQ4_XS: return ref::quantize_iq4_xs_w;
    case Type::IQ2_XXS: return ref::quantize_iq2_xxs_w;
    case Type::IQ2_XS: return ref::quantize_iq2_xs_w;
    case Type::IQ2_S: return ref::quantize_iq2_s_w;
    case Type::IQ3_XXS: return ref::quantize_iq3_xxs_w;
    case Type::IQ3_S: return ref::quantize_iq3_s_w;
    case Type::IQ1_S: return ref::quantize_iq1_s_w;
    case Type::IQ1_M: return ref::quantize_iq1_m_w;
    default: return nullptr;
  }
}

}  // namespace

bool uses_weights(Type t) { return weighted_fn(t) != nullptr; }

Status quantize_row_weighted(Type t, const float* src, void* dst, int64_t n, const float* w) {
  const WeightedFn fn = weighted_fn(t);
  if (w == nullptr || fn == nullptr) return quantize_row(t, src, dst, n);
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(w[i]) || w[i] < 0)
      return make_error("cannot quantize with weight ", w[i], " at element ", i, " (weights must be finite and >= 0)");
  KITE_TRY(check_quantizable(t, src, n));
  fn(src, dst, n, w);
  return ok_status();
}

void importance_weights(const float* x, const float* importance, int64_t n, float* w) {
  double s2 = 0, mean_imp = 0;
  for (int64_t i = 0; i < n; ++i) {
    s2 += static_cast<double>(x[i]) * x[i];
    mean_imp += importance[i];
  }
  s2 /= static_cast<double>(std::max<int64_t>(n, 1));
  const float floor_imp = static_cast<float>(1e-6 * mean_imp / static_cast<double>(std::max<int64_t>(n, 1)));
  for (int64_t i = 0; i < n; ++i)
    w[i] = std::max(importance[i], floor_imp) * static_cast<float>(std::sqrt(s2 + static_cast<double>(x[i]) * x[i]));
}

Status quantize_rows_importance(Type t, const float* src, void* dst, int64_t nrows, int64_t n_per_row,
                                const float* importance) {
  if (importance == nullptr || !uses_weights(t)) return quantize_rows(t, src, dst, nrows, n_per_row);
  if (nrows < 0) return make_error("cannot quantize ", nrows, " rows");
  for (int64_t i = 0; i < n_per_row; ++i)
    if (!std::isfinite(importance[i]) || importance[i] < 0)
      return make_error("importance of column ", i, " is ", importance[i], " (must be finite and >= 0)");
  KITE_ASSIGN_OR_RETURN(size_t bytes, row_size(t, n_per_row));
  auto* out = static_cast<uint8_t*>(dst);
  std::vector<float> w(static_cast<size_t>(n_per_row));
  for (int64_t r = 0; r < nrows; ++r) {
    const float* x = src + r * n_per_row;
    importance_weights(x, importance, n_per_row, w.data());
    Status st = quantize_row_weighted(t, x, out + static_cast<size_t>(r) * bytes, n_per_row, w.data());
    if (!st) return st.error().with_context("row " + std::to_string(r));
  }
  return ok_status();
}

}  // namespace kite::quant
