#include "formats/quant/superblock.h"

#include <algorithm>
#include <cmath>

#include "src/base/half.h"

namespace kite::quant {

float round_to_half(float v) { return fp16_to_fp32(fp32_to_fp16(v)); }

fit::Window window_for(const fit::Grid& g) {
  // In grid steps around the end r of the grid. Tuned on llama-draft's tensors: widening any of
  // the others further changed no type's error by more than 0.1%; Q6_K's 16-element sub-blocks
  // (r = 32) gain 0.8% from the wider window, Q5_0 (r = 16) and the code grids nothing.
  const float r = std::max(std::fabs(g.v[0]), std::fabs(g.v[g.size - 1]));
  if (!g.uniform || r < 16) return {0.6f, 1.2f};
  if (r == 32) return {1.0f - 8.0f / r, 1.0f + 3.0f / r};
  return {1.0f - 4.0f / r, 1.0f + 2.0f / r};
}

uint16_t finalize_half_scale(const float* x, const float* w, int n, const fit::Grid& g, float d, uint8_t* idx) {
  const auto zero = static_cast<uint8_t>(g.nearest(0));
  uint8_t cur[256];
  uint16_t best_bits = 0;
  double best = INFINITY;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const uint16_t bits = fp32_to_fp16(d);
    const float dq = fp16_to_fp32(bits);
    // Re-round every element for the stored scale; score with the dequantization formula.
    double err = 0, sxv = 0, svv = 0;
    for (int i = 0; i < n; ++i) {
      cur[i] = dq != 0 ? static_cast<uint8_t>(g.nearest(x[i] / dq)) : zero;
      const double e = static_cast<double>(x[i]) - static_cast<double>(g.v[cur[i]] * dq);
      const double wi = w ? w[i] : 1.0;
      err += wi * e * e;
      sxv += wi * x[i] * g.v[cur[i]];
      svv += wi * g.v[cur[i]] * g.v[cur[i]];
    }
    if (err < best) {
      best = err;
      best_bits = bits;
      std::copy(cur, cur + n, idx);
    }
    if (svv <= 0) break;
    d = static_cast<float>(sxv / svv);  // least-squares refit for the next attempt
  }
  return best_bits;
}

namespace {

constexpr int kRefineIters = 4;

// ---------------------------------------------------------------------------------------------
// Affine super-blocks.

struct AffineState {
  float d = 0, dmin = 0;  // half-rounded super scales
  uint8_t sc[16] = {}, mc[16] = {};
};

// Rounds every element for the state's codes; returns the exact squared error of the result.
double affine_round(const float* x, const float* w, const AffineSpec& sp, const AffineState& st, uint8_t* q) {
  double err = 0;
  for (int j = 0; j < sp.n_sub; ++j) {
    // The dequantization formula, with its float operations in order.
    const float ds = st.d * static_cast<float>(st.sc[j]);
    const float dm = st.dmin * static_cast<float>(st.mc[j]);
    for (int i = j * sp.len; i < (j + 1) * sp.len; ++i) {
      q[i] = ds > 0 ? static_cast<uint8_t>(fit::round_clamp((x[i] + dm) / ds, 0, sp.qmax)) : 0;
      const double e = static_cast<double>(x[i]) - static_cast<double>(ds * q[i] - dm);
      err += (w ? w[i] : 1.0) * e * e;
    }
  }
  return err;
}

// Least-squares super scales for fixed codes and q: x ~ D * (sc q) - M * mc, D, M >= 0.
void affine_refit_super(const float* x, const float* w, const AffineSpec& sp, const uint8_t* q, AffineState* st) {
  double saa = 0, sab = 0, sbb = 0, sax = 0, sbx = 0;
  for (int j = 0; j < sp.n_sub; ++j) {
    for (int i = j * sp.len; i < (j + 1) * sp.len; ++i) {
      const double a = static_cast<double>(st->sc[j]) * q[i], b = st->mc[j];
      const double wi = w ? w[i] : 1.0;
      saa += wi * a * a;
      sab += wi * a * b;
      sbb += wi * b * b;
      sax += wi * a * x[i];
      sbx += wi * b * x[i];
    }
  }
  // Normal equations: [saa, -sab; -sab, sbb] [D; M] = [sax; -sbx].
  const double det = saa * sbb - sab * sab;
  double dd = 0, mm = 0;
  if (det > 1e-12 * saa * sbb && det > 0) {
    dd = (sax * sbb - sab * sbx) / det;
    mm = (sax * sab - saa * sbx) / det;
  }
  if (!(dd > 0) || mm < 0) {  // constrained: one of them at zero
    mm = 0;
    dd = saa > 0 ? sax / saa : 0;
  }
  if (dd <= 0) return;
  st->d = round_to_half(static_cast<float>(dd));
  st->dmin = round_to_half(static_cast<float>(mm));
}

// Best codes of each sub-block for fixed super scales: around the least-squares (sigma, mu) of
// x ~ D sigma q - M mu for the current q, every pair of codes within one step is tried with the
// elements re-rounded and scored by the dequantization formula. Updates codes and q.
void affine_refit_codes(const float* x, const float* w, const AffineSpec& sp, uint8_t* q, AffineState* st) {
  const double dd = st->d, mm = st->dmin;
  if (!(dd > 0)) return;
  uint8_t cand[256];
  for (int j = 0; j < sp.n_sub; ++j) {
    const int n = sp.len;
    const float* xj = x + j * n;
    const float* wj = w ? w + j * n : nullptr;
    uint8_t* qj = q + j * n;
    double sw = 0, sq = 0, sq2 = 0, sx = 0, sxq = 0;
    for (int i = 0; i < n; ++i) {
      const double wi = wj ? wj[i] : 1.0;
      sw += wi;
      sq += wi * qj[i];
      sq2 += wi * qj[i] * qj[i];
      sx += wi * xj[i];
      sxq += wi * xj[i] * qj[i];
    }
    // Continuous optimum of (sigma, mu) for these q (mu >= 0).
    double sig = st->sc[j], mu = st->mc[j];
    const double det = sw * sq2 - sq * sq;
    if (det > 1e-12 * sw * sq2 && sq2 > 0) {
      sig = (sw * sxq - sx * sq) / (det * dd);
      mu = mm > 0 ? (sig * dd * sq - sx) / (sw * mm) : 0;
      if (mu <= 0) {  // the min at zero: scale alone
        mu = 0;
        sig = sxq / (sq2 * dd);
      }
    }
    const int s0 = static_cast<int>(std::lround(std::clamp(sig, 0.0, 1e4)));
    const int m0 = static_cast<int>(std::lround(std::clamp(mu, 0.0, 1e4)));
    double best = INFINITY;
    uint8_t best_s = st->sc[j], best_m = st->mc[j];
    for (int s = std::max(0, s0 - 1); s <= std::min(sp.code_max, s0 + 1); ++s) {
      for (int m = std::max(0, m0 - 1); m <= std::min(sp.code_max, m0 + 1); ++m) {
        if (mm == 0 && m > 0) break;
        const float ds = st->d * static_cast<float>(s), dm = st->dmin * static_cast<float>(m);
        const float inv = ds > 0 ? 1.0f / ds : 0.0f;
        float err = 0;  // float is plenty for comparing candidates of one sub-block
        for (int i = 0; i < n; ++i) {
          const int k = fit::round_clamp((xj[i] + dm) * inv, 0, sp.qmax);
          cand[i] = static_cast<uint8_t>(k);
          const float e = xj[i] - (ds * static_cast<float>(k) - dm);
          err += (wj ? wj[i] : 1.0f) * e * e;
        }
        if (err < best) {
          best = err;
          best_s = static_cast<uint8_t>(s);
          best_m = static_cast<uint8_t>(m);
          std::copy(cand, cand + n, qj);
        }
      }
    }
    st->sc[j] = best_s;
    st->mc[j] = best_m;
  }
}

// Codes for float sub-block values given a super scale (rounded, clamped).
void codes_for(const float* v, int n, float d, int code_max, uint8_t* codes) {
  for (int j = 0; j < n; ++j)
    codes[j] = d > 0 ? static_cast<uint8_t>(fit::round_clamp(v[j] / d, 0, code_max)) : 0;
}

}  // namespace

void quantize_affine_superblock(const float* x, const float* w, const AffineSpec& sp, AffineCodes* out) {
  // 1. Each sub-block on its own: scale s[j] >= 0 and min m[j] >= 0 (y = s q - m).
  float s[16], m[16], ws[16], wm[16];
  uint8_t q[256];
  for (int j = 0; j < sp.n_sub; ++j) {
    const fit::AffineFit f =
        fit::fit_affine(x + j * sp.len, w ? w + j * sp.len : nullptr, sp.len, sp.qmax, true, q + j * sp.len);
    s[j] = f.scale;
    m[j] = -f.offset;
    double q2 = 0, sw = 0;
    for (int i = j * sp.len; i < (j + 1) * sp.len; ++i) {
      const double wi = w ? w[i] : 1.0;
      q2 += wi * q[i] * q[i];
      sw += wi;
    }
    ws[j] = static_cast<float>(q2);  // an error in s costs its square times sum w q^2
    wm[j] = static_cast<float>(sw);  // an error in m costs its square times sum w
  }

  // 2. Starting codes: a weighted fit of the scales on the code grid, and the simple
  //    "largest value gets the largest code".
  const fit::Grid& codes = *sp.code_grid;
  const fit::Window cwin = window_for(codes);
  AffineState starts[2];
  {
    uint8_t idx[16];
    const float d = fit::fit_grid_scale_positive(s, ws, sp.n_sub, codes, idx, cwin);
    const float dm = fit::fit_grid_scale_positive(m, wm, sp.n_sub, codes, idx, cwin);
    starts[0].d = round_to_half(d);
    starts[0].dmin = round_to_half(dm);
    const float smax = *std::max_element(s, s + sp.n_sub), mmax = *std::max_element(m, m + sp.n_sub);
    starts[1].d = round_to_half(smax / sp.code_max);
    starts[1].dmin = round_to_half(mmax / sp.code_max);
    for (AffineState& st : starts) {
      codes_for(s, sp.n_sub, st.d, sp.code_max, st.sc);
      codes_for(m, sp.n_sub, st.dmin, sp.code_max, st.mc);
    }
  }

  // 3. From the better start, alternate: round the elements, refit the super scales, refit the
  //    codes (which re-rounds); keep the encoding with the best exact error.
  const double e0 = affine_round(x, w, sp, starts[0], q), e1 = affine_round(x, w, sp, starts[1], q);
  AffineState st = e0 <= e1 ? starts[0] : starts[1];
  double best = INFINITY;
  double err = affine_round(x, w, sp, st, q);
  for (int it = 0;; ++it) {
    if (!(err < best)) break;  // converged (or worse): the best is already stored
    best = err;
    out->d = fp32_to_fp16(st.d);
    out->dmin = fp32_to_fp16(st.dmin);
    std::copy(st.sc, st.sc + sp.n_sub, out->sc);
    std::copy(st.mc, st.mc + sp.n_sub, out->mc);
    std::copy(q, q + sp.n_sub * sp.len, out->q);
    if (it == kRefineIters) break;
    affine_refit_super(x, w, sp, q, &st);
    affine_refit_codes(x, w, sp, q, &st);
    err = affine_round(x, w, sp, st, q);
  }
}

// ---------------------------------------------------------------------------------------------
// Symmetric super-blocks.

namespace {

struct SymState {
  float d = 0;  // half-rounded
  int16_t sc[16] = {};
};

double sym_round(const float* x, const float* w, const SymmetricSpec& sp, const SymState& st, uint8_t* q) {
  const fit::Grid& g = *sp.grid;
  const auto zero = static_cast<uint8_t>(g.nearest(0));
  double err = 0;
  for (int j = 0; j < sp.n_sub; ++j) {
    const float ds = st.d * static_cast<float>(st.sc[j]);  // as the dequantization computes it
    for (int i = j * sp.len; i < (j + 1) * sp.len; ++i) {
      q[i] = ds != 0 ? static_cast<uint8_t>(g.nearest(x[i] / ds)) : zero;
      const double e = static_cast<double>(x[i]) - static_cast<double>(ds * g.v[q[i]]);
      err += (w ? w[i] : 1.0) * e * e;
    }
  }
  return err;
}

// Least-squares super scale for fixed codes and q: x ~ D * (sc g[q]).
void sym_refit_super(const float* x, const float* w, const SymmetricSpec& sp, const uint8_t* q, SymState* st) {
  double saa = 0, sax = 0;
  for (int j = 0; j < sp.n_sub; ++j) {
    for (int i = j * sp.len; i < (j + 1) * sp.len; ++i) {
      const double a = static_cast<double>(st->sc[j]) * sp.grid->v[q[i]];
      const double wi = w ? w[i] : 1.0;
      saa += wi * a * a;
      sax += wi * a * x[i];
    }
  }
  if (saa > 0 && sax != 0) st->d = round_to_half(static_cast<float>(sax / saa));
}

// Best code of each sub-block for a fixed super scale: around the least-squares code for the
// current q (a 1-D quadratic), the codes within one step are tried with the elements re-rounded
// and scored by the dequantization formula. Updates codes and q.
void sym_refit_codes(const float* x, const float* w, const SymmetricSpec& sp, uint8_t* q, SymState* st) {
  if (st->d == 0) return;
  const fit::Grid& g = *sp.grid;
  uint8_t cand[256];
  for (int j = 0; j < sp.n_sub; ++j) {
    const int n = sp.len;
    const float* xj = x + j * n;
    const float* wj = w ? w + j * n : nullptr;
    uint8_t* qj = q + j * n;
    double sgg = 0, sgx = 0;
    for (int i = 0; i < n; ++i) {
      const double v = g.v[qj[i]], wi = wj ? wj[i] : 1.0;
      sgg += wi * v * v;
      sgx += wi * v * xj[i];
    }
    if (sgg <= 0) continue;
    const int c0 = fit::round_clamp(static_cast<float>(sgx / (sgg * st->d)), sp.code_min, sp.code_max);
    float best = INFINITY;
    for (int c = std::max(sp.code_min, c0 - 1); c <= std::min(sp.code_max, c0 + 1); ++c) {
      if (c == 0) continue;
      const float ds = st->d * static_cast<float>(c);
      const float inv = 1.0f / ds;
      float err = 0;  // float is plenty for comparing candidates of one sub-block
      for (int i = 0; i < n; ++i) {
        cand[i] = static_cast<uint8_t>(g.nearest(xj[i] * inv));
        const float e = xj[i] - ds * g.v[cand[i]];
        err += (wj ? wj[i] : 1.0f) * e * e;
      }
      if (err < best) {
        best = err;
        st->sc[j] = static_cast<int16_t>(c);
        std::copy(cand, cand + n, qj);
      }
    }
  }
}

}  // namespace

void quantize_symmetric_superblock(const float* x, const float* w, const SymmetricSpec& sp, SymmetricCodes* out) {
  const fit::Grid& g = *sp.grid;
  // 1. Each sub-block on its own: signed float scale s[j].
  float s[16], ws[16];
  uint8_t q[256];
  const fit::Window win = window_for(g);
  for (int j = 0; j < sp.n_sub; ++j) {
    s[j] = fit::fit_grid_scale(x + j * sp.len, w ? w + j * sp.len : nullptr, sp.len, g, q + j * sp.len, win);
    double g2 = 0;
    for (int i = j * sp.len; i < (j + 1) * sp.len; ++i) g2 += (w ? w[i] : 1.0) * g.v[q[i]] * g.v[q[i]];
    ws[j] = static_cast<float>(g2);  // an error in s costs its square times sum w g^2
  }

  // 2. Starting codes: weighted fit on the code grid, and "largest |s| gets the code_min end".
  const fit::Grid& codes = *sp.code_grid;
  SymState starts[2];
  {
    uint8_t idx[16];
    starts[0].d = round_to_half(fit::fit_grid_scale(s, ws, sp.n_sub, codes, idx, window_for(codes)));
    int jmax = 0;
    for (int j = 1; j < sp.n_sub; ++j)
      if (std::fabs(s[j]) > std::fabs(s[jmax])) jmax = j;
    starts[1].d = round_to_half(s[jmax] / static_cast<float>(sp.code_min));
    for (SymState& st : starts)
      for (int j = 0; j < sp.n_sub; ++j)
        st.sc[j] = static_cast<int16_t>(
            st.d != 0 ? fit::round_clamp(s[j] / st.d, sp.code_min, sp.code_max) : 0);
  }

  // 3. From the better start, alternate: round the elements, refit the super scale, refit the
  //    codes (which re-rounds); keep the encoding with the best exact error.
  const double e0 = sym_round(x, w, sp, starts[0], q), e1 = sym_round(x, w, sp, starts[1], q);
  SymState st = e0 <= e1 ? starts[0] : starts[1];
  double best = INFINITY;
  double err = sym_round(x, w, sp, st, q);
  for (int it = 0;; ++it) {
    if (!(err < best)) break;  // converged (or worse): the best is already stored
    best = err;
    out->d = fp32_to_fp16(st.d);
    std::copy(st.sc, st.sc + sp.n_sub, out->sc);
    std::copy(q, q + sp.n_sub * sp.len, out->q);
    if (it == kRefineIters) break;
    sym_refit_super(x, w, sp, q, &st);
    sym_refit_codes(x, w, sp, q, &st);
    err = sym_round(x, w, sp, st, q);
  }
}

}  // namespace kite::quant
