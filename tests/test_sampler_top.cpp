// Sampling from a row's top k logits (Op::kTopK) against sampling the whole row: the tokens,
// logprobs and RNG draws must be the same, and what the top k cannot settle must be said.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "src/runtime/sampler.h"

using kite::Sampler;
using kite::SamplerParams;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// A row's top k as Op::kTopK returns it (computed here by a full sort).
struct TopRow {
  std::vector<float> logits, ids;
  float lse = 0.f;
  kite::TopLogits view() const { return {logits, ids, lse}; }
};

TopRow top_of(const std::vector<float>& x, int k) {
  std::vector<int32_t> idx;
  for (int32_t i = 0; i < static_cast<int32_t>(x.size()); ++i)
    if (x[static_cast<size_t>(i)] > -kInf) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return x[static_cast<size_t>(a)] > x[static_cast<size_t>(b)]; });
  TopRow t;
  double m = -kInf, z = 0;
  for (float v : x) m = std::max(m, static_cast<double>(v));
  for (float v : x) z += std::exp(v - m);
  t.lse = static_cast<float>(m + std::log(z));
  for (int j = 0; j < k; ++j) {
    const bool have = j < static_cast<int>(idx.size());
    t.logits.push_back(have ? x[static_cast<size_t>(idx[static_cast<size_t>(j)])] : -kInf);
    t.ids.push_back(have ? static_cast<float>(idx[static_cast<size_t>(j)]) : -1.f);
  }
  return t;
}

// The chosen token's logprob and the top logprobs a whole row's sample gave (up to the rounding
// of the log-sum-exp).
void check_same_logprobs(const Sampler& whole, const Sampler& top) {
  CHECK(std::abs(whole.chosen_logprob() - top.chosen_logprob()) < 1e-5f);
  REQUIRE(whole.top_logprobs().size() == top.top_logprobs().size());
  for (size_t j = 0; j < top.top_logprobs().size(); ++j) {
    CHECK(whole.top_logprobs()[j].token == top.top_logprobs()[j].token);
    CHECK(std::abs(whole.top_logprobs()[j].logprob - top.top_logprobs()[j].logprob) < 1e-5f);
  }
}

}  // namespace

TEST_CASE("sampler: sampling from a row's top k gives the whole row's tokens and logprobs") {
  const int k = 64, n_vocab = 5000;
  std::mt19937 g(11);
  std::normal_distribution<float> normal(0.f, 2.5f);
  struct Variant {
    const char* what;
    SamplerParams p;
  };
  auto with = [](float t, int32_t top_k, float top_p, float min_p, float typical, int32_t n_logprobs) {
    SamplerParams p;
    p.temperature = t, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p, p.typical_p = typical;
    p.n_logprobs = n_logprobs, p.seed = 99;
    return p;
  };
  const std::vector<Variant> variants = {
      {"greedy", with(0.f, 0, 1.f, 0.f, 1.f, 0)},
      {"greedy with 20 logprobs", with(0.f, 0, 1.f, 0.f, 1.f, 20)},
      {"llama.cpp's defaults", with(0.8f, 40, 0.95f, 0.05f, 1.f, 0)},
      {"top-k 64, hot, logprobs", with(1.5f, 64, 1.f, 0.f, 1.f, 5)},
      {"top-k 10, typical-p", with(1.f, 10, 0.9f, 0.f, 0.5f, 0)},
      {"top-k 1", with(0.7f, 1, 1.f, 0.f, 1.f, 1)},
  };
  for (const Variant& v : variants) {
    INFO(v.what);
    Sampler whole(v.p), top(v.p);
    REQUIRE(top.samples_from_top(k, n_vocab));
    for (int step = 0; step < 300; ++step) {
      std::vector<float> x(n_vocab);
      for (float& e : x) e = normal(g);
      if (step % 3 == 0)  // ties at the cut, and banned tokens
        for (size_t i = 0; i < x.size(); i += 7) x[i] = i % 2 ? 4.f : -kInf;
      const int32_t a = whole.sample(x);
      const int32_t b = top.sample_top(top_of(x, k).view());
      REQUIRE(a == b);
      if (v.p.n_logprobs > 0) check_same_logprobs(whole, top);
      whole.accept(a);
      top.accept(b);
    }
  }
  // Nothing allowed: -1, as from the whole row.
  Sampler s(with(0.8f, 40, 0.95f, 0.05f, 1.f, 3));
  CHECK(s.sample_top(top_of(std::vector<float>(100, -kInf), k).view()) == -1);
}

TEST_CASE("sampler: what the top k cannot settle alone, sample_top() says, having drawn nothing") {
  // Top-p and min-p without top-k, a top-k above k, a grammar's mask, penalties and a logit bias
  // that lower logits: sample_top() gives the whole row's token where the candidates close within
  // the k best, and otherwise kNeedsRow: sample() on the (masked) row then gives the same.
  const int n_vocab = 5000;
  std::mt19937 g(23);
  std::normal_distribution<float> normal(0.f, 2.5f);
  struct Variant {
    const char* what;
    SamplerParams p;
    int allowed_in_100 = 100;  // a grammar's mask (changing every step) lets this many through
  };
  auto with = [](float t, int32_t top_k, float top_p, float min_p) {
    SamplerParams p;
    p.temperature = t, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p, p.seed = 4;
    return p;
  };
  auto penalized = [](SamplerParams p) {
    p.repeat_penalty = 1.5f, p.frequency_penalty = 0.5f, p.presence_penalty = 1.f, p.penalty_last_n = 16;
    p.logit_bias = {{3, -2.f}, {17, -kInf}, {400, -0.5f}};
    return p;
  };
  SamplerParams with_logprobs = with(0.9f, 0, 0.9f, 0.f);
  with_logprobs.n_logprobs = 3;
  const std::vector<Variant> variants = {
      {"top-p 0.5", with(0.9f, 0, 0.5f, 0.f)},
      {"top-p 0.9, logprobs", with_logprobs},
      {"min-p 0.1", with(0.9f, 0, 1.f, 0.1f)},
      {"min-p 0.002", with(0.9f, 0, 1.f, 0.002f)},
      {"top-p 0.7, min-p 0.05", with(0.9f, 0, 0.7f, 0.05f)},
      {"top-k 100, min-p 0.05", with(0.9f, 100, 1.f, 0.05f)},
      {"top-k 100, top-p 0.5", with(0.9f, 100, 0.5f, 0.f)},
      {"greedy, penalties, bias", penalized(with(0.f, 0, 1.f, 0.f))},
      {"llama.cpp's defaults, penalties, bias", penalized(with(0.8f, 40, 0.95f, 0.05f))},
      {"top-k 40 alone, penalties", penalized(with(0.8f, 40, 1.f, 0.f))},
      {"top-p 0.9, penalties", penalized(with(0.8f, 0, 0.9f, 0.f))},
      {"greedy, grammar", with(0.f, 0, 1.f, 0.f), 75},
      {"greedy, strict grammar", with(0.f, 0, 1.f, 0.f), 3},
      {"llama.cpp's defaults, grammar", with(0.8f, 40, 0.95f, 0.05f), 75},
      {"top-k 40 alone, grammar", with(0.8f, 40, 1.f, 0.f), 75},
      {"top-p 0.9, grammar", with(0.8f, 0, 0.9f, 0.f), 75},
      {"min-p 0.1, grammar and penalties", penalized(with(0.8f, 0, 1.f, 0.1f)), 30},
  };
  int from_top = 0, needs_row = 0;
  // k 64 (the scheduler's default), then 16 (--top-k-outputs 16: a top-k 40 passes the k).
  for (const int k : {64, 16}) {
    for (const Variant& v : variants) {
      INFO(std::string(v.what), " k ", k);
      const bool masked = v.allowed_in_100 < 100;
      Sampler whole(v.p), top(v.p);
      if (!top.may_sample_from_top(k, n_vocab, masked)) {
        CHECK(k < 40);  // (top-k 40 alone needs 40)
        continue;
      }
      int variant_from_top = 0;
      for (int step = 0; step < 200; ++step) {
        std::vector<float> x(n_vocab);
        for (float& e : x) e = normal(g);
        if (step % 4 == 0)  // a peaked row: the nucleus closes at once
          x[static_cast<size_t>(step) % x.size()] = 20.f;
        if (step % 3 == 0)  // ties at the cut, and banned tokens
          for (size_t i = 0; i < x.size(); i += 7) x[i] = i % 2 ? 4.f : -kInf;
        auto allowed = [&](int32_t t) { return (t * 7919 + step * 31) % 100 < v.allowed_in_100; };
        std::vector<float> row = x;  // the row as the grammar masks it
        if (masked)
          for (size_t i = 0; i < row.size(); ++i)
            if (!allowed(static_cast<int32_t>(i))) row[i] = -kInf;
        const int32_t a = whole.sample_in_place(row);
        const TopRow t = top_of(x, k);
        int32_t b = masked ? top.sample_top(t.view(), allowed) : top.sample_top(t.view());
        if (b == Sampler::kNeedsRow) {
          ++needs_row;
          row = x;
          if (masked)
            for (size_t i = 0; i < row.size(); ++i)
              if (!allowed(static_cast<int32_t>(i))) row[i] = -kInf;
          b = top.sample_in_place(row);
        } else {
          ++from_top, ++variant_from_top;
        }
        REQUIRE(a == b);
        if (v.p.n_logprobs > 0) check_same_logprobs(whole, top);
        whole.accept(a);
        top.accept(b);
      }
      MESSAGE(std::string(v.what), ": ", variant_from_top, " of 200 from the top ", k);
      if (k == 64) CHECK(variant_from_top > (v.allowed_in_100 < 10 ? 0 : 20));
    }
  }
  CHECK(from_top > 2000);
  CHECK(needs_row > 600);
}

TEST_CASE("sampler: a token drawn on the device comes with the logprobs of the whole row") {
  const int n_vocab = 5000;
  std::mt19937 g(5);
  std::normal_distribution<float> normal(0.f, 2.5f);
  SamplerParams p;  // the OpenAI API's defaults, with logprobs
  p.temperature = 1.f, p.top_k = 0, p.top_p = 1.f, p.min_p = 0.f, p.n_logprobs = 5, p.seed = 7;
  Sampler whole(p), device(p);
  REQUIRE(device.draws_on_device(64, n_vocab));
  int outside = 0;  // draws of a token past the top 64: its logprob comes from its own logit
  for (int step = 0; step < 200; ++step) {
    std::vector<float> x(n_vocab);
    for (float& e : x) e = normal(g);
    const int32_t a = whole.sample(x);
    REQUIRE(a >= 0);
    (void)device.uniform();  // the one the device's draw took
    const TopRow t = top_of(x, 64);
    kite::TopLogits v = t.view();
    v.drawn = a;  // (what the device draws with that uniform: ops and gpu_checks test it)
    v.drawn_logit = x[static_cast<size_t>(a)];
    outside += std::find(t.ids.begin(), t.ids.end(), static_cast<float>(a)) == t.ids.end() ? 1 : 0;
    REQUIRE(device.take_drawn(v) == a);
    check_same_logprobs(whole, device);
    whole.accept(a);
    device.accept(a);
  }
  CHECK(outside > 20);
}

TEST_CASE("sampler: which parameters can sample from a row's top k") {
  auto ok = [](SamplerParams p, int k = 64, int n_vocab = 32000) { return Sampler(p).samples_from_top(k, n_vocab); };
  SamplerParams p;  // llama.cpp's defaults: top-k 40
  CHECK(ok(p));
  CHECK_FALSE(ok(p, 32));      // top-k 40 > 32 candidates
  CHECK_FALSE(ok(p, 64, 40));  // top-k covers the whole vocabulary: the chain filters every token
  p.top_k = 0;                 // top-p alone may need the whole row
  CHECK_FALSE(ok(p));
  // Others may: sample_top() finds out (and says so when it cannot).
  auto may = [](SamplerParams q, bool grammar = false) { return Sampler(q).may_sample_from_top(64, 32000, grammar); };
  CHECK(may(p));
  for (auto change : std::vector<std::function<void(SamplerParams&)>>{
           [](SamplerParams& q) { q.frequency_penalty = 0.5f, q.presence_penalty = 0.2f, q.repeat_penalty = 1.1f; },
           [](SamplerParams& q) {
             q.logit_bias = {{1, -1.f}, {2, -kInf}};
           },
           [](SamplerParams& q) { q.top_k = 100; },  // (with top-p or min-p)
           [](SamplerParams& q) { q.top_p = 1.f; }, [](SamplerParams& q) { q.min_p = 0.f; },
           [](SamplerParams& q) { q.temperature = 0.f, q.repeat_penalty = 1.3f; }}) {
    SamplerParams q = p;
    change(q);
    CHECK(may(q));
    CHECK(may(q, true));  // (a grammar too)
  }
  for (auto change : std::vector<std::function<void(SamplerParams&)>>{
           [](SamplerParams& q) { q.top_p = 1.f, q.min_p = 0.f; },                 // plain temperature: drawn
           [](SamplerParams& q) { q.top_k = 100, q.top_p = 1.f, q.min_p = 0.f; },  // needs 100 candidates
           [](SamplerParams& q) { q.top_k = 32000; },                              // the whole vocabulary
           [](SamplerParams& q) { q.typical_p = 0.5f; }, [](SamplerParams& q) { q.n_logprobs = 65; },
           [](SamplerParams& q) { q.presence_penalty = -0.5f; },  // raises logits
           [](SamplerParams& q) { q.repeat_penalty = 0.9f; },
           [](SamplerParams& q) {
             q.logit_bias = {{1, 0.5f}};
           },
           [](SamplerParams& q) { q.frequency_penalty = 0.5f, q.n_logprobs = 1; }}) {  // (the row's lse changes)
    SamplerParams q = p;
    change(q);
    CHECK_FALSE(may(q));
  }
  SamplerParams logprobs = p;
  logprobs.n_logprobs = 2;
  CHECK(may(logprobs));
  CHECK_FALSE(may(logprobs, true));  // (a grammar's mask changes the log-sum-exp)
  p.temperature = 0.f;               // greedy needs the best one only
  CHECK(ok(p));
  p.n_logprobs = 65;
  CHECK_FALSE(ok(p));
  p.n_logprobs = 20;
  CHECK(ok(p));
  p.repeat_penalty = 1.1f;  // penalties and bias change the logits first
  CHECK_FALSE(ok(p));
  p.repeat_penalty = 1.f;
  p.logit_bias = {{5, 1.f}};
  CHECK_FALSE(ok(p));
  // Plain temperature sampling over the whole row is drawn on the device instead.
  auto draws = [](SamplerParams q, int n_vocab = 32000) { return Sampler(q).draws_on_device(64, n_vocab); };
  SamplerParams plain;
  plain.temperature = 1.f, plain.top_k = 0, plain.top_p = 1.f, plain.min_p = 0.f;
  CHECK(draws(plain));
  CHECK_FALSE(ok(plain));
  CHECK(draws(plain, 32000));
  plain.top_k = 32000;  // (a top-k of the whole vocabulary filters nothing)
  CHECK(draws(plain));
  plain.top_k = 0;
  plain.n_logprobs = 64;  // (logprobs from the top 64, the log-sum-exp and the drawn token's logit)
  CHECK(draws(plain));
  plain.n_logprobs = 0;
  for (auto change : std::vector<std::function<void(SamplerParams&)>>{
           [](SamplerParams& q) { q.temperature = 0.f; }, [](SamplerParams& q) { q.top_p = 0.9f; },
           [](SamplerParams& q) { q.min_p = 0.05f; }, [](SamplerParams& q) { q.typical_p = 0.5f; },
           [](SamplerParams& q) { q.n_logprobs = 65; }, [](SamplerParams& q) { q.presence_penalty = 0.5f; },
           [](SamplerParams& q) {
             q.logit_bias = {{1, -1.f}};
           },
           [](SamplerParams& q) { q.top_k = 40; }}) {
    SamplerParams q = plain;
    change(q);
    CHECK_FALSE(draws(q));
  }
}
