#include "formats/quant/fit.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kite::quant::fit {

int Grid::nearest(float t) const {
  if (uniform) return round_clamp(t - v[0], 0, size - 1);
  // Number of midpoints <= t is the index of the nearest value (ties go up).
  return static_cast<int>(std::upper_bound(mid, mid + size - 1, t) - mid);
}

Grid uniform_grid(int lo, int hi) {
  Grid g;
  g.size = hi - lo + 1;
  g.uniform = true;
  for (int k = 0; k < g.size; ++k) g.v[k] = static_cast<float>(lo + k);
  for (int k = 0; k + 1 < g.size; ++k) g.mid[k] = 0.5f * (g.v[k] + g.v[k + 1]);
  return g;
}

Grid table_grid(const int8_t* values, int n) {
  Grid g;
  g.size = n;
  for (int k = 0; k < n; ++k) g.v[k] = static_cast<float>(values[k]);
  for (int k = 0; k + 1 < n; ++k) g.mid[k] = 0.5f * (g.v[k] + g.v[k + 1]);
  return g;
}

double sq_error(const float* x, const float* y, int n) {
  double e = 0;
  for (int i = 0; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - static_cast<double>(y[i]);
    e += d * d;
  }
  return e;
}

namespace {

// One step of the sweep: element i moves from index `from` to `to` once the inverse scale
// passes s.
struct Event {
  float s;
  uint16_t i;
  uint8_t from, to;
};

struct SweepResult {
  double score = 0;  // (sum w x v)^2 / (sum w v^2): the error reduction of the best assignment
  double d = 0;      // its least-squares scale (for the normalized x)
};

// Sweeps inverse scales s > 0 over the window for normalized x (max |x| == 1): starts from the
// rounding at the window's low end, applies every index change in order of s, and keeps the
// assignment with the best least-squares score. Writes that assignment to idx.
SweepResult sweep(const float* x, const float* w, int n, const Grid& g, Window win, uint8_t* idx) {
  const float r = std::max(std::fabs(g.v[0]), std::fabs(g.v[g.size - 1]));
  const float s_lo = win.lo * r, s_hi = win.hi * r;
  // Events live on the stack unless the window holds unusually many of them.
  Event local[1024];
  std::vector<Event> heap;
  Event* events = local;
  int n_events = 0;
  const size_t cap = static_cast<size_t>(n) * static_cast<size_t>(g.size - 1);
  if (cap > std::size(local)) {
    heap.resize(cap);
    events = heap.data();
  }
  double sxv = 0, svv = 0;
  // Initial assignment and the events of each element inside the window.
  for (int i = 0; i < n; ++i) {
    const float t0 = x[i] * s_lo, t1 = x[i] * s_hi;
    const int k0 = g.nearest(t0);
    idx[i] = static_cast<uint8_t>(k0);
    const double wi = w ? w[i] : 1.0;
    sxv += wi * x[i] * g.v[k0];
    svv += wi * g.v[k0] * g.v[k0];
    if (x[i] > 0) {
      for (int k = k0; k + 1 < g.size && g.mid[k] <= t1; ++k)
        events[n_events++] = {g.mid[k] / x[i], static_cast<uint16_t>(i), static_cast<uint8_t>(k),
                              static_cast<uint8_t>(k + 1)};
    } else if (x[i] < 0) {
      for (int k = k0 - 1; k >= 0 && g.mid[k] >= t1; --k)
        events[n_events++] = {g.mid[k] / x[i], static_cast<uint16_t>(i), static_cast<uint8_t>(k + 1),
                              static_cast<uint8_t>(k)};
    }
  }
  std::sort(events, events + n_events, [](const Event& a, const Event& b) { return a.s < b.s; });

  // Walk the events, scoring each assignment (per element, events are already in order).
  auto score = [](double a, double b) { return b > 0 ? a * a / b : 0.0; };
  double best = score(sxv, svv);
  int best_e = -1;
  for (int e = 0; e < n_events; ++e) {
    const Event& ev = events[e];
    const double wi = w ? w[ev.i] : 1.0;
    const double vf = g.v[ev.from], vt = g.v[ev.to];
    sxv += wi * x[ev.i] * (vt - vf);
    svv += wi * (vt * vt - vf * vf);
    const double sc = score(sxv, svv);
    if (sc > best) {
      best = sc;
      best_e = e;
    }
  }
  // Replay up to the best event and refit the scale exactly.
  for (int e = 0; e <= best_e; ++e) idx[events[e].i] = events[e].to;
  double a = 0, b = 0;
  for (int i = 0; i < n; ++i) {
    const double wi = w ? w[i] : 1.0;
    a += wi * x[i] * g.v[idx[i]];
    b += wi * g.v[idx[i]] * g.v[idx[i]];
  }
  return {score(a, b), b > 0 ? a / b : 0.0};
}

// Max |x|, or 0.
float max_abs(const float* x, int n) {
  float a = 0;
  for (int i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}

float fit_impl(const float* x, const float* w, int n, const Grid& g, uint8_t* idx, Window win,
               bool both_signs) {
  const float amax = max_abs(x, n);
  if (amax == 0) {
    std::fill(idx, idx + n, static_cast<uint8_t>(g.nearest(0)));
    return 0;
  }
  // Normalize so that huge and tiny blocks behave alike (scale invariance).
  float xn[256], xneg[256];
  uint8_t idx2[256];
  for (int i = 0; i < n; ++i) xn[i] = x[i] / amax;
  const SweepResult pos = sweep(xn, w, n, g, win, idx);
  if (!both_signs) return static_cast<float>(pos.d * amax);
  for (int i = 0; i < n; ++i) xneg[i] = -xn[i];
  const SweepResult neg = sweep(xneg, w, n, g, win, idx2);
  if (neg.score > pos.score) {
    std::copy(idx2, idx2 + n, idx);
    return static_cast<float>(-neg.d * amax);
  }
  return static_cast<float>(pos.d * amax);
}

}  // namespace

float fit_grid_scale(const float* x, const float* w, int n, const Grid& g, uint8_t* idx, Window win) {
  return fit_impl(x, w, n, g, idx, win, /*both_signs=*/true);
}

float fit_grid_scale_positive(const float* x, const float* w, int n, const Grid& g, uint8_t* idx,
                              Window win) {
  return fit_impl(x, w, n, g, idx, win, /*both_signs=*/false);
}

AffineFit fit_affine(const float* x, const float* w, int n, int qmax, bool offset_nonpositive, uint8_t* q) {
  if (n <= 0 || n > 256) return {};  // blocks are 16 or 32 elements
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  if (offset_nonpositive) mn = std::min(mn, 0.0f);
  // A constant block (or an all-zero one): offset alone.
  if (!(mx > mn)) {
    std::fill(q, q + n, uint8_t{0});
    return {0.0f, mn, 0.0};
  }
  const double range = static_cast<double>(mx) - mn;
  double sw = 0, sx = 0, sx2 = 0;
  for (int i = 0; i < n; ++i) {
    const double wi = w ? w[i] : 1.0;
    sw += wi;
    sx += wi * x[i];
    sx2 += wi * x[i] * x[i];
  }

  AffineFit best;
  best.err = INFINITY;
  uint8_t cur[256] = {};
  // Candidate starts: the range split into qmax + delta steps, as delta sweeps -1 .. 1.5.
  constexpr int kStarts = 7;
  for (int c = 0; c < kStarts && sw > 0; ++c) {
    const double delta = -1.0 + 2.5 * c / (kStarts - 1);
    float inv = static_cast<float>((qmax + delta) / range), off = mn;
    // Alternate: round to the codes of (inv, off), then the weighted least-squares (scale,
    // offset) of those codes, until the codes stop changing.
    for (int it = 0; it < 4; ++it) {
      bool changed = false;
      double sq = 0, sq2 = 0, sxq = 0;
      for (int i = 0; i < n; ++i) {
        const int k = round_clamp((x[i] - off) * inv, 0, qmax);
        changed |= k != cur[i];
        cur[i] = static_cast<uint8_t>(k);
        const double wi = w ? w[i] : 1.0;
        sq += wi * k;
        sq2 += wi * k * k;
        sxq += wi * x[i] * k;
      }
      if (it > 0 && !changed) break;
      const double det = sw * sq2 - sq * sq;
      if (!(det > 1e-12 * sw * sq2)) break;  // all (weighted) codes equal: the scale is undetermined
      double s = (sw * sxq - sx * sq) / det;
      double o = (sx - s * sq) / sw;
      if (offset_nonpositive && o > 0) {
        o = 0;
        s = sxq / sq2;
      }
      if (!(s > 0)) break;
      const float sf = static_cast<float>(s), of = static_cast<float>(o);
      // sum w (x - s q - o)^2 expanded over the sums (for the float s, o actually stored).
      const double ds = sf, dof = of;
      const double err = sx2 - 2 * ds * sxq - 2 * dof * sx + ds * ds * sq2 + 2 * ds * dof * sq + sw * dof * dof;
      if (err < best.err) {
        best = {sf, of, std::max(err, 0.0)};
        std::copy(cur, cur + n, q);
      }
      inv = 1.0f / sf;
      off = of;
    }
  }
  if (best.err == INFINITY) {  // no candidate had two distinct codes: fall back to the range
    const float s = static_cast<float>(range / qmax);
    for (int i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(round_clamp((x[i] - mn) / s, 0, qmax));
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = static_cast<double>(x[i]) - (static_cast<double>(s) * q[i] + mn);
      err += (w ? w[i] : 1.0) * e * e;
    }
    best = {s, mn, err};
  }
  return best;
}

}  // namespace kite::quant::fit
