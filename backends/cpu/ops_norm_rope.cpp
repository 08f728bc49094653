// rms_norm and rope.
#include <algorithm>
#include <cmath>

#include "backends/cpu/matmul.h"
#include "backends/cpu/ops.h"

namespace kite::cpu {

void op_rms_norm(Tensor* dst, const KernelCtx& c) {
  const Tensor* a = dst->src[0];
  const Tensor* w = dst->src[1];
  const float eps = dst->params.f[0];
  const int64_t n = a->ne[0];
  const MatmulKernels* mk = active_kernels();
  int64_t begin, end;
  split(a->n_rows(), c, &begin, &end);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
    const auto* x = reinterpret_cast<const float*>(a->row_ptr(i1, i2, i3));
    auto* y = reinterpret_cast<float*>(dst->row_ptr(i1, i2, i3));
    float sum = 0.f;
    if (mk != nullptr) {
      sum = mk->sum_sq(x, n);
    } else {
      for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
    }
    const float s = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
    if (w != nullptr) {
      const auto* wv = reinterpret_cast<const float*>(w->data);
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s * wv[i];
    } else {
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
    }
  }
}

namespace {

// Inverse frequency of rotary pair i (of n_rot/2), with the model's rope scaling applied.
// Returns the per-pair multiplier for positions; `mscale` gets the magnitude factor (yarn).
void rope_inv_freq(const OpParams& p, int n_rot, float* inv_freq, float* mscale) {
  const float base = p.f[0], factor = p.f[1];
  const auto scaling = static_cast<RopeScaling>(p.i[2]);
  const float orig_ctx = static_cast<float>(p.i[3]);
  const float two_pi = 6.283185307179586f;
  *mscale = 1.f;
  float low = 0, high = 0;
  if (scaling == RopeScaling::kYarn) {
    const float beta_fast = p.f[4], beta_slow = p.f[5];
    auto corr_dim = [&](float rot) {
      return static_cast<float>(n_rot) * std::log(orig_ctx / (rot * two_pi)) / (2.f * std::log(base));
    };
    low = std::max(0.f, std::floor(corr_dim(beta_fast)));
    high = std::min(static_cast<float>(n_rot - 1), std::ceil(corr_dim(beta_slow)));
    if (high == low) high += 0.001f;
    *mscale = p.f[6] * (factor > 1.f ? 0.1f * std::log(factor) + 1.f : 1.f);
  }
  for (int i = 0; i < n_rot / 2; ++i) {
    float f = std::pow(base, -2.f * static_cast<float>(i) / static_cast<float>(n_rot));
    switch (scaling) {
      case RopeScaling::kNone: break;
      case RopeScaling::kLinear: f /= factor; break;
      case RopeScaling::kLlama3: {
        const float low_wavelen = orig_ctx / p.f[2], high_wavelen = orig_ctx / p.f[3];
        const float wavelen = two_pi / f;
        if (wavelen > low_wavelen) {
          f /= factor;
        } else if (wavelen >= high_wavelen) {
          const float smooth = (orig_ctx / wavelen - p.f[2]) / (p.f[3] - p.f[2]);
          f = (1.f - smooth) * f / factor + smooth * f;
        }
        break;
      }
      case RopeScaling::kYarn: {
        const float ramp = std::clamp((static_cast<float>(i) - low) / (high - low), 0.f, 1.f);
        const float extrapolation = 1.f - ramp;
        f = f / factor * (1.f - extrapolation) + f * extrapolation;
        break;
      }
    }
    inv_freq[i] = f;
  }
}

}  // namespace

void op_rope(Tensor* dst, const KernelCtx& c) {
  const Tensor* a = dst->src[0];
  const auto* pos = dst->src[1]->host<const int32_t>();
  const auto mode = static_cast<RopeMode>(dst->params.i[0]);
  const int n_rot = dst->params.i[1];
  const size_t half = static_cast<size_t>(n_rot / 2);
  std::vector<float>& buf = *c.scratch;  // inv_freq | cos | sin
  if (buf.size() < 3 * half) buf.resize(3 * half);
  float* inv_freq = buf.data();
  float* cs = inv_freq + half;
  float* sn = cs + half;
  float mscale = 1.f;
  // Frequency factors (llama.cpp's rope_freqs tensor, how its GGUF files carry Llama 3's rope
  // scaling) divide each pair's frequency and take the place of the llama3 formula.
  const Tensor* ff = dst->src[2];
  OpParams params = dst->params;
  if (ff != nullptr && static_cast<RopeScaling>(params.i[2]) == RopeScaling::kLlama3)
    params.i[2] = static_cast<int32_t>(RopeScaling::kNone);
  rope_inv_freq(params, n_rot, inv_freq, &mscale);
  if (ff != nullptr)
    for (size_t i = 0; i < half; ++i) inv_freq[i] /= ff->host<const float>()[i];
  const int64_t hd = a->ne[0], n_head = a->ne[1];
  // Work items are (head, token) pairs in token-major order; cos/sin are computed once per token
  // of this thread's range and reused for all its heads.
  int64_t begin, end;
  split(n_head * a->ne[2], c, &begin, &end);
  int64_t cached_t = -1;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t h = r % n_head, t = r / n_head;
    if (t != cached_t) {
      const float p = static_cast<float>(pos[t]);
      for (size_t i = 0; i < half; ++i) {
        const float theta = p * inv_freq[i];
        cs[i] = std::cos(theta) * mscale;
        sn[i] = std::sin(theta) * mscale;
      }
      cached_t = t;
    }
    const auto* x = reinterpret_cast<const float*>(a->row_ptr(h, t));
    auto* y = reinterpret_cast<float*>(dst->row_ptr(h, t));
    for (size_t i = 0; i < half; ++i) {
      const int64_t i0 = mode == RopeMode::kNorm ? static_cast<int64_t>(2 * i) : static_cast<int64_t>(i);
      const int64_t i1 = mode == RopeMode::kNorm ? static_cast<int64_t>(2 * i + 1) : static_cast<int64_t>(i + half);
      const float x0 = x[i0], x1 = x[i1];
      y[i0] = x0 * cs[i] - x1 * sn[i];
      y[i1] = x0 * sn[i] + x1 * cs[i];
    }
    for (int64_t i = n_rot; i < hd; ++i) y[i] = x[i];
  }
}

}  // namespace kite::cpu
