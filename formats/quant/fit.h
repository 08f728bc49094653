// kite/formats/quant/fit.h — least-squares searches the reference quantizers share (internal).
//
// Every quantizer here minimizes the squared error sum(w * (x - y)^2) of its block: w == nullptr
// means all ones (the plain error, bit for bit the same result as weights of 1), and an
// importance matrix (kite imatrix) or a larger fit (choosing sub-block scale codes) supplies
// other weights. Two shapes of problem occur:
//   - scale fits, x ~ d * g[idx] for a code book g (uniform integers or IQ4's table): solved by
//     an exact sweep over the inverse scale (fit_grid_scale);
//   - affine fits, x ~ s * q + o for integer q in 0..qmax: multi-start alternating least squares
//     (fit_affine).
#pragma once

#include <cstdint>

namespace kite::quant::fit {

// An ascending code book of `size` values (at most 256), with the midpoints between neighbours.
struct Grid {
  float v[256];
  float mid[255];
  int size = 0;
  bool uniform = false;  // v[k] = v[0] + k: nearest() is a rounding
  // Index of the value nearest to t (ties go up).
  int nearest(float t) const;
};
// Uniform integer grid lo..hi.
Grid uniform_grid(int lo, int hi);
// Grid from a table of ascending int8 values (IQ4_NL).
Grid table_grid(const int8_t* values, int n);

// Window of the scale sweep: inverse scales s with max|x| * s in [lo * R, hi * R], R the largest
// magnitude in the grid. The optimum of a block lies where its largest element lands near the
// grid's end, so a window around it loses nothing in practice while keeping the sweep short.
struct Window {
  float lo = 0.6f;
  float hi = 1.2f;
};

// Finds d and indices minimizing sum w[i] * (x[i] - d * g.v[idx[i]])^2 (w == nullptr: all 1).
// d may be negative (the grid is tried in both orientations). Exact within the window: every
// assignment reachable by rounding x/d for d in the window is considered, with d refitted by
// least squares for each. Returns d (0 for an all-zero x; then idx = nearest(0)).
float fit_grid_scale(const float* x, const float* w, int n, const Grid& g, uint8_t* idx,
                     Window win = {});

// Same, restricted to d > 0 (one orientation): for non-negative data on non-negative grids.
float fit_grid_scale_positive(const float* x, const float* w, int n, const Grid& g, uint8_t* idx,
                              Window win = {});

// Affine fit x ~ s * q + o, q in 0..qmax, s >= 0. With `offset_nonpositive` the offset is kept
// <= 0 (the K-quants store it as a subtracted non-negative min). Multi-start: candidate scales
// (max - min) / (qmax + delta) each refined by alternating rounding and least squares.
// Minimizes sum w[i] * (x[i] - s q[i] - o)^2 (w == nullptr: all 1; weights must be >= 0).
// Writes q; returns the (weighted) squared error.
struct AffineFit {
  float scale = 0;
  float offset = 0;
  double err = 0;
};
AffineFit fit_affine(const float* x, const float* w, int n, int qmax, bool offset_nonpositive, uint8_t* q);

// Squared error of x against y (double accumulation so huge values do not overflow).
double sq_error(const float* x, const float* y, int n);

// Round-to-nearest as int (ties up), clamped to lo..hi; NaN gives lo. Clamping first keeps the
// conversion defined for any t; then t - lo + 0.5 > 0, so truncation is floor (no libm call).
inline int round_clamp(float t, int lo, int hi) {
  if (!(t > static_cast<float>(lo))) return lo;
  if (t >= static_cast<float>(hi)) return hi;
  const int k = static_cast<int>(t - static_cast<float>(lo) + 0.5f) + lo;
  return k < hi ? k : hi;
}

}  // namespace kite::quant::fit
