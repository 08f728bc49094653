// kite/formats/quant/types.h — the one table of tensor element types.
//
// Type ids and byte layouts are ggml's, so GGUF files from llama.cpp map 1:1. A type is a
// block of `block_size` elements stored in `type_size` bytes; rows (ne[0]) are a whole
// number of blocks. Every type kite can read has a row here (so files containing it can be
// inspected); `dequantize`/`quantize` are set for the types kite computes with. These scalar
// routines are the specification every fast kernel is tested against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "src/base/status.h"

namespace kite::quant {

enum class Type : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

// Converts `n` elements (a multiple of block_size) of blocks at `src` to floats at `dst`.
using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
// Quantizes `n` floats (a multiple of block_size) to blocks at `dst`. Inputs are finite and
// within max_quantizable() (callers check with quantize_row(), which rejects the rest).
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);

struct TypeTraits {
  Type type;
  std::string_view name;    // ggml's name: "f32", "q4_K", ...
  int64_t block_size;       // elements per block
  size_t type_size;         // bytes per block
  bool is_quantized;        // block-quantized (not a plain float/int type)
  DequantizeFn dequantize;  // nullptr where kite cannot compute with the type
  QuantizeFn quantize;      // nullptr where kite cannot produce the type
};

// The row for a type id, or nullptr for an id no ggml version ever defined (or one removed).
const TypeTraits* find_traits(uint32_t type_id);
inline const TypeTraits* find_traits(Type t) { return find_traits(static_cast<uint32_t>(t)); }
// Same, by ggml name ("q4_K", case-insensitive).
const TypeTraits* find_traits(std::string_view name);

// Bytes of a row of `n` elements, or an error if `n` is not a whole number of blocks.
Result<size_t> row_size(Type t, int64_t n);

// Whether the table has a reference routine for the type (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q8_1, Q2_K..Q6_K, Q8_K, IQ4_NL, IQ4_XS, IQ1_S..IQ3_S).
bool can_dequantize(Type t);
bool can_quantize(Type t);
// Largest |x| quantize_row() accepts: 65504 (the largest half) for types that store values or
// scales as halves, FLT_MAX for F32, BF16 and Q8_K.
float max_quantizable(Type t);

// The IQ codebook types (IQ1_S..IQ3_S) can also be made up, far faster than quantized:
// random_blocks fills n elements (whole blocks) with random codes and scales, each block's
// d set so that its values' RMS is `rms`. For synthetic weights (kite bench --synthetic, tests);
// deterministic in `seed`. An error for a type where can_randomize is false.
bool can_randomize(Type t);
Status random_blocks(Type t, void* dst, int64_t n, uint64_t seed, float rms);

// Checked entry points: reject unknown/uncomputable types, partial blocks and (quantize) NaN,
// Inf and values beyond max_quantizable(). `n` elements are contiguous blocks (so a run of
// whole rows can be passed at once).
//
// The reference quantizers minimize each block's squared error with searches over the scales
// (see fit.h, superblock.h); Q8_0, Q8_1 and Q8_K use the plain round(x / (max|x| / 127)) rule,
// since they double as the activation types kernels quantize on the fly. Deterministic: the
// same input gives the same bytes (for a given build; compilers that contract a * b + c into
// FMAs can change the last bit of a scale).
Status dequantize_row(Type t, const void* src, float* dst, int64_t n);
Status quantize_row(Type t, const float* src, void* dst, int64_t n);
// `nrows` rows of `n_per_row` elements each (row r at src + r * n_per_row) to consecutive rows
// of row_size(t, n_per_row) bytes. Errors name the row.
Status quantize_rows(Type t, const float* src, void* dst, int64_t nrows, int64_t n_per_row);

// --- Importance-weighted quantization (`kite quantize --imatrix`) ----------------------------
//
// An importance matrix gives, for each input column j of a weight, the mean squared activation
// E[a_j^2] it is multiplied by. The error a quantized row adds to a matmul output is then about
// sum_j E[a_j^2] (x_j - y_j)^2, so the quantizers minimize a weighted squared error instead of
// the plain one, with the same searches (every scale/min fit, sub-block code choice and final
// rounding is weighted).

// Whether the type's quantizer takes weights: Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL,
// IQ4_XS and the codebook types IQ1_S..IQ3_S. The float types and Q8_0/Q8_1/Q8_K (a fixed rounding rule, shared with
// the kernels' on-the-fly quantization) ignore them.
bool uses_weights(Type t);

// quantize_row minimizing sum w[i] * (x[i] - y[i])^2. `w`: n finite weights >= 0, or nullptr
// (all ones: exactly quantize_row's bytes). Types that do not use weights ignore w.
Status quantize_row_weighted(Type t, const float* src, void* dst, int64_t n, const float* w);

// The per-element weights of one row from its columns' importance: w[i] = imp[i] * sqrt(s2 +
// x[i]^2), s2 the row's mean x^2. The second factor (llama.cpp's choice too) leans toward the
// large elements of a row; on llama-draft, imp alone, this and s2 doubled gave held-out
// perplexities within noise of each other (bench/RESULTS.md). Importance values below 1e-6 of
// the row's mean importance are raised to it, so a column never seen active still counts.
void importance_weights(const float* x, const float* importance, int64_t n, float* w);

// quantize_rows with per-column importance (n_per_row values; nullptr: quantize_rows). Errors
// name the row; a non-finite or negative importance value is an error.
Status quantize_rows_importance(Type t, const float* src, void* dst, int64_t nrows, int64_t n_per_row,
                                const float* importance);

}  // namespace kite::quant
