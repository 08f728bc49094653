// kite/formats/quant/superblock.h — two-level scale searches for the K-quants and IQ4_XS (internal).
//
// A super-block holds `n_sub` sub-blocks of `len` elements. Each sub-block has an integer scale
// code (and for the affine types a min code) multiplied by the super-block's half-precision
// scale(s). The search:
//   1. fits each sub-block on its own (float scale, and min);
//   2. quantizes the sub-block scales to codes (a weighted scale fit over the code grid, plus
//      the simple "largest scale gets the largest code" start);
//   3. from the better start, alternates until the error stops falling: refit the super-block
//      scale(s) by least squares for the current codes and elements, then for each sub-block try
//      the codes within one step of its least-squares optimum with the elements re-rounded.
//      Every candidate is scored with the exact dequantization formula (float operations in
//      the dequantizer's order) and the best encoding is kept, so no step can make it worse.
// Every error is weighted: sum w[i] * (x[i] - y[i])^2, w == nullptr meaning all ones (the same
// bytes as weights of exactly 1). The weights come from an importance matrix (see types.h).
#pragma once

#include <cstdint>

#include "formats/quant/fit.h"

namespace kite::quant {

// y = (d * sc[j]) * q - (dmin * mc[j]), q in 0..qmax, codes in 0..code_max (Q2_K, Q4_K, Q5_K).
struct AffineSpec {
  int n_sub;
  int len;
  int qmax;
  int code_max;
  const fit::Grid* code_grid;  // uniform_grid(0, code_max)
};
struct AffineCodes {
  uint16_t d = 0, dmin = 0;  // half bits
  uint8_t sc[16] = {}, mc[16] = {};
  uint8_t q[256] = {};
};
void quantize_affine_superblock(const float* x, const float* w, const AffineSpec& spec, AffineCodes* out);

// y = (d * sc[j]) * grid.v[q], codes in code_min..code_max (Q3_K, Q6_K, IQ4_XS).
struct SymmetricSpec {
  int n_sub;
  int len;
  const fit::Grid* grid;  // element code book; q is an index into it
  int code_min;
  int code_max;
  const fit::Grid* code_grid;  // uniform_grid(code_min, code_max)
};
struct SymmetricCodes {
  uint16_t d = 0;  // half bits
  int16_t sc[16] = {};
  uint8_t q[256] = {};
};
void quantize_symmetric_superblock(const float* x, const float* w, const SymmetricSpec& spec, SymmetricCodes* out);

// Stores a block scale fitted by fit_grid_scale (y = D * g.v[idx], D = the half of d): tries the
// half nearest d and the half nearest the least-squares refit after re-rounding, re-rounds the
// elements for the half actually stored, and keeps the better (by the error weighted with w,
// nullptr: all ones). Returns the half bits.
uint16_t finalize_half_scale(const float* x, const float* w, int n, const fit::Grid& g, float d, uint8_t* idx);

// Sweep window suited to a grid: narrow for fine uniform grids (rounding error is uniform
// there, only the end matters), wider for coarse or non-uniform ones.
fit::Window window_for(const fit::Grid& g);

// Rounds to the nearest half and back.
float round_to_half(float v);

}  // namespace kite::quant
