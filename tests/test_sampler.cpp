// The sampler chain and stop strings. Distribution checks draw many tokens from a fixed logit
// vector and compare the histogram with the distribution computed here, straight from each
// filter's definition, by a chi-square test at a threshold the right answer misses with
// probability < 1e-9; each check also shows that a plausible wrong expectation fails it.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "src/base/utf8.h"
#include "src/runtime/sampler.h"
#include "src/runtime/stop_matcher.h"

using kite::Sampler;
using kite::SamplerParams;
using kite::StopMatcher;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Every filter off: the chain is temperature and the draw.
SamplerParams plain(float temperature) {
  SamplerParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.f;
  p.min_p = 0.f;
  p.seed = 1234;
  return p;
}

const std::vector<float> kLogits = {1.2f, 3.0f, 2.1f, -0.5f, 2.6f, 0.3f, 1.9f, -2.0f, 0.9f, 2.4f, -1.0f, 1.5f};

std::vector<double> softmax_over(const std::vector<double>& l, const std::vector<size_t>& ids, double t) {
  double m = -INFINITY;
  for (size_t i : ids) m = std::max(m, l[i]);
  std::vector<double> q;
  double z = 0;
  for (size_t i : ids) z += q.emplace_back(std::exp((l[i] - m) / t));
  for (double& x : q) x /= z;
  return q;
}

// The chain's distribution, from the definitions: top-k, typical, top-p, min-p (each on the
// softmax of the survivors at temperature 1), then the softmax at the temperature.
std::vector<double> expected_dist(const std::vector<double>& l, const SamplerParams& p) {
  std::vector<size_t> keep;
  for (size_t i = 0; i < l.size(); ++i)
    if (std::isfinite(l[i])) keep.push_back(i);
  auto by_logit = [&](size_t a, size_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::sort(keep.begin(), keep.end(), by_logit);
  if (p.top_k > 0 && keep.size() > static_cast<size_t>(p.top_k)) keep.resize(static_cast<size_t>(p.top_k));
  if (p.typical_p < 1.f) {
    const auto q = softmax_over(l, keep, 1.0);
    double h = 0;
    for (double x : q) h -= x * std::log(x);
    std::vector<size_t> idx(keep.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(),
              [&](size_t a, size_t b) { return std::abs(-std::log(q[a]) - h) < std::abs(-std::log(q[b]) - h); });
    std::vector<size_t> kept;
    double cum = 0;
    for (size_t j : idx) {
      kept.push_back(keep[j]);
      cum += q[j];
      if (cum > p.typical_p) break;
    }
    std::sort(kept.begin(), kept.end(), by_logit);
    keep = kept;
  }
  if (p.top_p < 1.f) {
    const auto q = softmax_over(l, keep, 1.0);
    double cum = 0;
    for (size_t j = 0; j < keep.size(); ++j) {
      cum += q[j];
      if (cum >= p.top_p) {
        keep.resize(j + 1);
        break;
      }
    }
  }
  if (p.min_p > 0.f) {
    const auto q = softmax_over(l, keep, 1.0);
    const double qmax = *std::max_element(q.begin(), q.end());
    std::vector<size_t> kept;
    for (size_t j = 0; j < keep.size(); ++j)
      if (q[j] >= p.min_p * qmax) kept.push_back(keep[j]);
    keep = kept;
  }
  std::vector<double> out(l.size(), 0.0);
  const auto q = softmax_over(l, keep, p.temperature);
  for (size_t j = 0; j < keep.size(); ++j) out[keep[j]] = q[j];
  return out;
}

std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

std::vector<int64_t> histogram(Sampler& s, const std::vector<float>& logits, int64_t n) {
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = s.sample(logits);
    REQUIRE(t >= 0);
    ++counts[static_cast<size_t>(t)];
  }
  return counts;
}

// Chi-square critical value with tail probability ~1e-9 (Wilson-Hilferty, z = 6).
double chi2_critical(int df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + 6.0 * std::sqrt(a), 3.0);
}

// Does the histogram fit `p`? A sample on a token `p` gives probability 0 never fits.
bool fits(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n, double* chi2_out = nullptr) {
  double chi2 = 0;
  int bins = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (p[i] == 0.0) {
      if (counts[i] != 0) return false;
      continue;
    }
    const double e = p[i] * static_cast<double>(n);
    chi2 += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
    ++bins;
  }
  if (chi2_out) *chi2_out = chi2;
  return bins <= 1 ? chi2 == 0.0 : chi2 < chi2_critical(bins - 1);
}

int support(const std::vector<double>& p) {
  return static_cast<int>(std::count_if(p.begin(), p.end(), [](double x) { return x > 0; }));
}

// Draws `n` tokens with `params` and checks them against `right` (must fit) and `wrong` (must not).
void check_distribution(const SamplerParams& params, const std::vector<float>& logits, const std::vector<double>& right,
                        const std::vector<double>& wrong, int64_t n = 200000) {
  Sampler s(params);
  const auto counts = histogram(s, logits, n);
  double chi2_right = INFINITY, chi2_wrong = INFINITY;  // stays inf when a sample lands outside the support
  const bool right_fits = fits(counts, right, n, &chi2_right);
  const bool wrong_fits = fits(counts, wrong, n, &chi2_wrong);
  MESSAGE("support ", support(right), ", chi2 ", chi2_right, " (critical ",
          chi2_critical(std::max(1, support(right) - 1)), "), wrong expectation chi2 ", chi2_wrong);
  CHECK(right_fits);
  CHECK_FALSE(wrong_fits);
}

}  // namespace

TEST_CASE("sampler: temperature alone samples softmax(logits / T)") {
  const SamplerParams p = plain(0.7f);
  check_distribution(p, kLogits, expected_dist(to_double(kLogits), p), expected_dist(to_double(kLogits), plain(1.f)));
}

TEST_CASE("sampler: top-k keeps exactly the k most likely tokens") {
  SamplerParams p = plain(1.f);
  p.top_k = 4;
  SamplerParams wrong = p;
  wrong.top_k = 5;
  check_distribution(p, kLogits, expected_dist(to_double(kLogits), p), expected_dist(to_double(kLogits), wrong));
}

// Each p filter sees temperature 1; applying the temperature first is the classic mistake.
std::vector<double> temperature_first(const std::vector<float>& logits, SamplerParams p) {
  std::vector<double> l = to_double(logits);
  for (double& x : l) x /= p.temperature;
  p.temperature = 1.f;
  return expected_dist(l, p);
}

TEST_CASE("sampler: top-p keeps the smallest nucleus reaching p, at temperature 1") {
  SamplerParams p = plain(2.f);
  p.top_p = 0.75f;
  check_distribution(p, kLogits, expected_dist(to_double(kLogits), p), temperature_first(kLogits, p));
}

TEST_CASE("sampler: min-p drops tokens under min_p times the top probability") {
  SamplerParams p = plain(2.f);
  p.min_p = 0.2f;
  check_distribution(p, kLogits, expected_dist(to_double(kLogits), p), temperature_first(kLogits, p));
}

TEST_CASE("sampler: typical-p keeps the tokens whose surprisal is nearest the entropy") {
  // One token with p ~ 0.3 and fifty sharing the rest: the entropy (~3.3 nats) is near the
  // fifty's surprisal (~4.3), far from the top token's (~1.2), so typical sampling drops the most
  // likely token, which top-p never does.
  std::vector<float> logits(51);
  logits[0] = 3.0f;
  for (size_t i = 1; i < logits.size(); ++i) logits[i] = 0.2f * std::sin(static_cast<float>(i));
  SamplerParams p = plain(1.f);
  p.typical_p = 0.5f;
  SamplerParams wrong = plain(1.f);
  wrong.top_p = 0.5f;
  const auto right = expected_dist(to_double(logits), p);
  CHECK(right[0] == 0.0);  // the test is about that
  check_distribution(p, logits, right, expected_dist(to_double(logits), wrong));
}

TEST_CASE("sampler: the default chain, with and without top-k, on a 1000-token vocabulary") {
  // 200 likely tokens near 0 and 800 unlikely ones at -4: the nucleus (top-p 0.9) needs ~190
  // tokens, so the unsorted path sorts in growing chunks, and min-p 0.05 prunes the tail before
  // top-p while top-p still normalizes over it.
  std::vector<float> logits(1000, -4.f);
  for (size_t i = 0; i < 200; ++i) logits[i * 5] = 0.25f * std::sin(static_cast<float>(i) * 1.7f);
  SamplerParams p;
  p.top_k = 0;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.temperature = 0.8f;
  // Wrong: top-p normalized over the head only (as if the tail had been dropped first).
  std::vector<double> head_only = to_double(logits);
  for (double& x : head_only)
    if (x < -3.5) x = -INFINITY;
  auto check = [&](const SamplerParams& params) {
    const auto right = expected_dist(to_double(logits), params);
    CHECK(support(right) > 150);
    CHECK(support(right) < 200);
    check_distribution(params, logits, right, expected_dist(head_only, params), 40000);
  };
  check(p);
  p.top_k = 999;  // the sorted path: top-k first, larger than the nucleus
  check(p);
  p.top_k = 0;
  p.min_p = 0.f;  // nothing pruned: top-p sorts chunks of the whole vocabulary
  check(p);
}

TEST_CASE("sampler: a nucleus that closes within the best 64 or 1024 tokens") {
  // (Found by a heap over the row rather than by sorting every candidate: the same tokens.)
  // 1024: 300 likely tokens of 3000, the nucleus ~270 of them.
  std::vector<float> wide(3000, -6.f);
  for (size_t i = 0; i < 300; ++i) wide[i * 10 + 1] = 0.25f * std::sin(static_cast<float>(i) * 0.7f);
  SamplerParams q;
  q.top_k = 0, q.top_p = 0.9f, q.min_p = 0.f, q.temperature = 1.f;
  SamplerParams q_wrong = q;
  q_wrong.top_p = 0.6f;
  const auto q_right = expected_dist(to_double(wide), q);
  CHECK(support(q_right) > 200);
  CHECK(support(q_right) < 300);
  check_distribution(q, wide, q_right, expected_dist(to_double(wide), q_wrong), 60000);
  // 64, on a 1000-token vocabulary.
  std::vector<float> logits(1000, -4.f);
  for (size_t i = 0; i < 20; ++i) logits[i * 37 + 3] = 3.f + 0.1f * std::cos(static_cast<float>(i));
  logits[500] = 3.05f;  // (a tie with a head token would sort by id)
  SamplerParams p;
  p.top_k = 0, p.top_p = 0.9f, p.min_p = 0.f, p.temperature = 0.8f;
  SamplerParams wrong = p;
  wrong.top_p = 0.99f;  // (reaches into the tail)
  for (float min_p : {0.f, 0.5f}) {
    p.min_p = wrong.min_p = min_p;
    const auto right = expected_dist(to_double(logits), p);
    CHECK(support(right) > 10);
    CHECK(support(right) < 22);
    check_distribution(p, logits, right, expected_dist(to_double(logits), wrong), 40000);
  }
}

TEST_CASE("sampler: penalties over the window, then logit bias") {
  SamplerParams p = plain(1.f);
  p.repeat_penalty = 1.5f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.penalty_last_n = 6;
  p.logit_bias = {{0, 1.0f}, {7, -kInf}, {3, -0.5f}};
  const std::vector<int32_t> prompt = {1, 2, 2};
  const std::vector<int32_t> generated = {2, 3, 3, 5};
  // History 1 2 2 | 2 3 3 5; the window of 6 drops the first 1. In it: token 2 three times (one
  // generated), 3 twice (generated), 5 once (generated).
  auto penalized = [&](bool count_prompt_for_frequency) {
    std::vector<double> l = to_double(kLogits);
    struct C {
      size_t token;
      int all, gen;
    };
    for (C c : {C{2, 3, 1}, C{3, 2, 2}, C{5, 1, 1}}) {
      const int n = count_prompt_for_frequency ? c.all : c.gen;
      l[c.token] = l[c.token] > 0 ? l[c.token] / 1.5 : l[c.token] * 1.5;
      l[c.token] -= n * 0.5 + (n > 0 ? 0.25 : 0.0);
    }
    l[0] += 1.0;
    l[7] = -INFINITY;
    l[3] += -0.5;
    return l;
  };
  Sampler s(p);
  s.accept_prompt(prompt);
  for (int32_t t : generated) s.accept(t);
  const auto counts = histogram(s, kLogits, 200000);
  double chi2 = 0;
  CHECK(fits(counts, expected_dist(penalized(false), p), 200000, &chi2));
  MESSAGE("chi2 ", chi2);
  CHECK_FALSE(fits(counts, expected_dist(penalized(true), p), 200000));     // llama.cpp's counting
  CHECK_FALSE(fits(counts, expected_dist(to_double(kLogits), p), 200000));  // no penalties at all
  CHECK(counts[7] == 0);
}

TEST_CASE("sampler: penalties move the argmax, and leave with the window") {
  SamplerParams p = plain(0.f);  // greedy after penalties
  p.repeat_penalty = 4.0f;
  p.penalty_last_n = 2;
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
  Sampler s(p);
  CHECK(s.sample(logits) == 1);
  s.accept(1);
  CHECK(s.sample(logits) == 2);  // 3 / 4 = 0.75 < 2
  s.accept(2);
  CHECK(s.sample(logits) == 0);  // 1.0 > 0.75, 0.5, 0.5
  s.accept(0);                   // the window (2 tokens) is now {2, 0}: token 1 is free again
  CHECK(s.sample(logits) == 1);
  SUBCASE("a negative logit is multiplied, not divided") {
    const std::vector<float> neg = {-1.0f, -1.2f};
    Sampler n(p);
    CHECK(n.sample(neg) == 0);
    n.accept(0);
    CHECK(n.sample(neg) == 1);  // -4.0 < -1.2
  }
  SUBCASE("-1 remembers the whole history, 0 turns penalties off") {
    p.penalty_last_n = -1;
    Sampler all(p);
    for (int32_t t : {1, 2, 0, 3, 3, 3}) all.accept(t);
    CHECK(all.sample(logits) == 1);  // 0.75 vs 0.25, 0.5, 0.125
    p.penalty_last_n = 0;
    Sampler off(p);
    for (int32_t t : {1, 1, 1}) off.accept(t);
    CHECK(off.sample(logits) == 1);
  }
  SUBCASE("frequency and presence ignore the prompt; the repeat penalty does not") {
    SamplerParams f = plain(0.f);
    f.frequency_penalty = 2.0f;
    f.presence_penalty = 1.0f;
    Sampler fs(f);
    fs.accept_prompt(std::vector<int32_t>{1, 1, 1});
    CHECK(fs.sample(logits) == 1);
    fs.accept(1);
    CHECK(fs.sample(logits) == 2);  // 3 - 2 - 1 = 0
    SamplerParams r = plain(0.f);
    r.repeat_penalty = 2.0f;
    Sampler rs(r);
    rs.accept_prompt(std::vector<int32_t>{1});
    CHECK(rs.sample(logits) == 2);  // 1.5 < 2
  }
}

TEST_CASE("sampler: same seed, same tokens, another seed, other tokens, reset() replays") {
  SamplerParams p;  // the defaults, every filter on
  p.seed = 7;
  std::vector<float> logits(500);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 2.f * std::sin(static_cast<float>(i) * 0.37f);
  auto run = [&](Sampler& s) {
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits));
    return out;
  };
  const std::vector<float> original = logits;
  Sampler a(p), b(p);
  const auto ta = run(a);
  CHECK(ta == run(b));
  p.seed = 8;
  Sampler c(p);
  CHECK(ta != run(c));
  a.reset();
  CHECK(ta == run(a));
  CHECK(logits == original);
}

TEST_CASE("sampler: sample() leaves the logits alone, sample_in_place() applies penalties and bias") {
  SamplerParams p = plain(0.f);
  p.logit_bias = {{2, 10.f}};
  std::vector<float> logits = {1.f, 2.f, 3.f};
  Sampler s(p);
  CHECK(s.sample(logits) == 2);
  CHECK(logits == std::vector<float>{1.f, 2.f, 3.f});
  CHECK(s.sample_in_place(logits) == 2);
  CHECK(logits[2] == 13.f);
}

TEST_CASE("sampler: greedy takes the lowest id among ties, argmax skips banned tokens") {
  Sampler g(plain(0.f));
  CHECK(g.sample(std::vector<float>{1.f, 4.f, 2.f, 4.f, 4.f}) == 1);
  CHECK(Sampler::argmax(std::vector<float>{-kInf, -kInf, -5.f}) == 2);
  CHECK(Sampler::argmax(std::vector<float>{}) == -1);
  // Rows longer than argmax's blocks: ties across and within blocks, NaN, a partial last block.
  std::vector<float> row(5000, 1.f);
  row[17] = std::nanf("");
  row[3001] = row[1200] = row[1100] = 9.f;
  CHECK(Sampler::argmax(row) == 1100);
  row[4999] = 9.5f;
  CHECK(Sampler::argmax(row) == 4999);
  std::fill(row.begin(), row.end(), -kInf);
  CHECK(Sampler::argmax(row) == -1);
  // Ties at the top-k boundary resolve the same way: token 3 (the lower id) stays, token 4 goes.
  SamplerParams k = plain(1.f);
  k.top_k = 2;
  Sampler ks(k);
  const std::vector<float> tie = {0.f, 5.f, 0.f, 2.f, 2.f};
  for (int i = 0; i < 200; ++i) {
    const int32_t t = ks.sample(tie);
    CHECK((t == 1 || t == 3));
  }
}

TEST_CASE("sampler: a -inf logit bias bans a token, nothing left gives -1") {
  SamplerParams p = plain(1.f);
  p.logit_bias = {{1, -kInf}};
  Sampler s(p);
  const std::vector<float> logits = {0.f, 8.f, 0.5f};
  for (int i = 0; i < 2000; ++i) CHECK(s.sample(logits) != 1);
  SamplerParams g = plain(0.f);
  g.logit_bias = p.logit_bias;
  CHECK(Sampler(g).sample(logits) == 2);
  g.logit_bias = {{0, -kInf}, {1, -kInf}, {2, -kInf}};
  CHECK(Sampler(g).sample(logits) == -1);
  p.logit_bias = g.logit_bias;
  CHECK(Sampler(p).sample(logits) == -1);
}

TEST_CASE("sampler: logprobs are the model's log-softmax after penalties and bias") {
  SamplerParams p;  // defaults: the truncation must not change the logprobs
  p.n_logprobs = 12;
  p.logit_bias = {{10, -kInf}, {5, 1.0f}};
  Sampler s(p);
  const int32_t t = s.sample(kLogits);
  std::vector<double> l = to_double(kLogits);
  l[10] = -INFINITY;
  l[5] += 1.0;
  std::vector<size_t> all(l.size());
  std::iota(all.begin(), all.end(), 0);
  all.erase(all.begin() + 10);
  const auto q = softmax_over(l, all, 1.0);
  const auto top = s.top_logprobs();
  REQUIRE(top.size() == 11);  // the banned token is not listed
  double sum = 0;
  for (size_t i = 0; i < top.size(); ++i) {
    sum += std::exp(top[i].logprob);
    if (i > 0) CHECK(top[i].logprob <= top[i - 1].logprob);
    const size_t j =
        static_cast<size_t>(std::find(all.begin(), all.end(), static_cast<size_t>(top[i].token)) - all.begin());
    REQUIRE(j < all.size());
    CHECK(top[i].logprob == doctest::Approx(std::log(q[j])).epsilon(1e-5));
  }
  CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(top[0].token == 1);
  const auto chosen = std::find_if(top.begin(), top.end(), [&](const auto& x) { return x.token == t; });
  REQUIRE(chosen != top.end());
  CHECK(s.chosen_logprob() == doctest::Approx(chosen->logprob));
  SUBCASE("top 3 only, greedy") {
    p.n_logprobs = 3;
    p.temperature = 0.f;
    Sampler g(p);
    CHECK(g.sample(kLogits) == 1);
    REQUIRE(g.top_logprobs().size() == 3);
    CHECK(g.top_logprobs()[1].token == 4);
    CHECK(g.top_logprobs()[2].token == 9);
    CHECK(g.chosen_logprob() == g.top_logprobs()[0].logprob);
  }
  SUBCASE("none asked, none given") {
    Sampler n(SamplerParams{});
    n.sample(kLogits);
    CHECK(n.top_logprobs().empty());
    CHECK(std::isnan(n.chosen_logprob()));
  }
}

TEST_CASE("sampler: validate names the field and the range") {
  auto error_of = [](const SamplerParams& p, int32_t n_vocab = 100) {
    auto st = Sampler::validate(p, n_vocab);
    return st ? std::string() : st.error().message;
  };
  CHECK(error_of(SamplerParams{}).empty());
  SamplerParams p;
  p.top_p = 1.5f;
  CHECK(error_of(p) == "top_p must be in [0, 1], got 1.5");
  p = {};
  p.min_p = -0.1f;
  CHECK(error_of(p).find("min_p must be in [0, 1]") == 0);
  p = {};
  p.temperature = -1.f;
  CHECK(error_of(p).find("temperature") == 0);
  p = {};
  p.temperature = std::nanf("");
  CHECK(error_of(p).find("temperature") == 0);
  p = {};
  p.top_k = -2;
  CHECK(error_of(p) == "top_k must be >= 0 (0: off), got -2");
  p = {};
  p.typical_p = -1.f;
  CHECK(error_of(p).find("typical_p") == 0);
  p = {};
  p.repeat_penalty = 0.f;
  CHECK(error_of(p).find("repeat_penalty") == 0);
  p = {};
  p.frequency_penalty = kInf;
  CHECK(error_of(p).find("frequency_penalty") == 0);
  p = {};
  p.presence_penalty = std::nanf("");
  CHECK(error_of(p).find("presence_penalty") == 0);
  p = {};
  p.penalty_last_n = -2;
  CHECK(error_of(p).find("penalty_last_n") == 0);
  p = {};
  p.n_logprobs = 101;
  CHECK(error_of(p) == "n_logprobs must be in [0, 100] (the vocabulary size), got 101");
  p = {};
  p.logit_bias = {{3, 1.f}, {100, 1.f}};
  CHECK(error_of(p) == "logit_bias[1]: token 100 is out of range [0, 100)");
  p.logit_bias = {{-1, 1.f}};
  CHECK(error_of(p).find("logit_bias[0]: token -1") == 0);
  p.logit_bias = {{4, kInf}};
  CHECK(error_of(p).find("logit_bias[0]: bias for token 4 must be finite or -inf") == 0);
  p.logit_bias = {{4, -kInf}};
  CHECK(error_of(p).empty());
  CHECK(!error_of(SamplerParams{}, 0).empty());
}

TEST_CASE("sampler: microseconds per sample on 32000- and 152000-token vocabularies") {
  // Logits shaped like a model's: a broad bulk and a few strong candidates (an LCG, no std::
  // distributions, so every platform sees the same numbers).
  for (size_t n_vocab : {size_t{32000}, size_t{152000}}) {
    std::vector<float> logits(n_vocab);
    uint64_t x = 88172645463325252ull;
    for (float& v : logits) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>((x >> 40) & 0xffff) / 65536.f * 8.f - 4.f;
    }
    for (size_t i = 0; i < 10; ++i) logits[(i * 7919) % n_vocab] = 12.f - static_cast<float>(i) * 0.5f;
    auto time_us = [&](const SamplerParams& p) {
      Sampler s(p);
      for (int i = 0; i < 5; ++i) s.sample(logits);  // warm-up: buffers grow to the vocabulary
      // The fastest of 7 batches of 20: the machine is shared, and noise only ever adds time.
      double best = INFINITY;
      int64_t sum = 0;
      for (int batch = 0; batch < 7; ++batch) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 20; ++i) sum += s.sample(logits);
        best = std::min(best,
                        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 20);
      }
      CHECK(sum >= 0);
      return best;
    };
    SamplerParams defaults;
    SamplerParams no_top_k;
    no_top_k.top_k = 0;
    SamplerParams logprobs;
    logprobs.n_logprobs = 5;
    SamplerParams greedy;
    greedy.temperature = 0.f;
    const double us_default = time_us(defaults);
    MESSAGE("vocab ", n_vocab, ": defaults ", us_default, " us/sample; top_k 0 ", time_us(no_top_k),
            " us; defaults + 5 logprobs ", time_us(logprobs), " us; greedy ", time_us(greedy), " us");
    CHECK(us_default < 20000.0);  // a sanity bound only (a loaded machine must not fail it)
  }
}

// --- stop strings --------------------------------------------------------------------------------

namespace {

struct StopRun {
  std::string text;
  bool stopped = false;
  int32_t index = -1;
  std::vector<std::string> emitted;  // what each push returned
};

StopRun feed(std::vector<std::string> stops, const std::vector<std::string>& pieces) {
  StopMatcher m(std::move(stops));
  StopRun r;
  for (const auto& piece : pieces) {
    r.emitted.push_back(m.push(piece));
    r.text += r.emitted.back();
  }
  r.text += m.flush();
  r.stopped = m.stopped();
  r.index = m.stop_index();
  return r;
}

}  // namespace

TEST_CASE("stop matcher: a stop string across pieces stops, and what follows is discarded") {
  const auto r = feed({"###"}, {"Hello #", "#", "# world", "more"});
  CHECK(r.text == "Hello ");
  CHECK(r.stopped);
  CHECK(r.index == 0);
  CHECK(r.emitted == std::vector<std::string>{"Hello ", "", "", ""});
  const auto miss = feed({"###"}, {"a #", "# b", " ##"});
  CHECK(miss.text == "a ## b ##");  // the held-back "##" comes out at flush
  CHECK(!miss.stopped);
  CHECK(miss.emitted == std::vector<std::string>{"a ", "## b", " "});
}

TEST_CASE("stop matcher: overlapping prefixes (stop \"ab\", text \"aab\")") {
  auto r = feed({"ab"}, {"a", "a", "b", "c"});
  CHECK(r.text == "a");
  CHECK(r.stopped);
  CHECK(r.emitted == std::vector<std::string>{"", "a", "", ""});
  r = feed({"aab"}, {"a", "a", "a", "b"});  // the match starts one byte later than the first try
  CHECK(r.text == "a");
  CHECK(r.stopped);
  r = feed({"abab"}, {"aba", "bab"});
  CHECK(r.text == "");
  CHECK(r.stopped);
}

TEST_CASE("stop matcher: several stop strings, the first to complete wins") {
  auto r = feed({"END", "\n\n"}, {"one\n", "\ntwo END"});
  CHECK(r.text == "one");
  CHECK(r.index == 1);
  r = feed({"bc", "abcd"}, {"xab", "c", "d"});  // "bc" completes first
  CHECK(r.text == "xa");
  CHECK(r.index == 0);
  r = feed({"cd", "bcd"}, {"abcd"});  // both complete in one piece: the earlier start wins
  CHECK(r.text == "a");
  CHECK(r.index == 1);
  r = feed({}, {"no ", "stops"});
  CHECK(r.text == "no stops");
  CHECK(!r.stopped);
  CHECK(r.emitted == std::vector<std::string>{"no ", "stops"});
}

TEST_CASE("stop matcher: UTF-8 stays whole") {
  // "é" = C3 A9, "日本" = E6 97 A5 E6 9C AC. A stop string made of multi-byte characters, fed a
  // byte at a time, never splits a character in what is emitted.
  const std::string text = "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC!";
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  auto r = feed({"\xE6\x97\xA5\xE6\x9C\xAC"}, bytes);
  CHECK(r.text == "caf\xC3\xA9 ");
  CHECK(r.stopped);
  for (const auto& e : r.emitted) CHECK(kite::valid_utf8(e));
  r = feed({}, bytes);  // no stops: an incomplete character is still held back until it completes
  CHECK(r.text == text);
  CHECK(r.emitted[3] == "");
  CHECK(r.emitted[4] == "\xC3\xA9");
  // A stop string sharing a lead byte with the text does not match a different character.
  r = feed({"\xC3\xA8"}, {"\xC3", "\xA9", "x"});
  CHECK(r.text == "\xC3\xA9x");
  CHECK(!r.stopped);
}

TEST_CASE("stop matcher: validate rejects empty, oversized and broken stop strings, reset starts over") {
  CHECK(StopMatcher::validate(std::vector<std::string>{"a", "</s>"}).ok());
  auto st = StopMatcher::validate(std::vector<std::string>{"ok", ""});
  REQUIRE(!st);
  CHECK(st.error().message.find("stop[1] is empty") == 0);
  st = StopMatcher::validate(std::vector<std::string>{std::string(StopMatcher::kMaxStopBytes + 1, 'x')});
  REQUIRE(!st);
  CHECK(st.error().message.find("stop[0] is 1025 bytes long") == 0);
  st = StopMatcher::validate(std::vector<std::string>{"\xC3"});
  REQUIRE(!st);
  CHECK(st.error().message == "stop[0] is not valid UTF-8");
  StopMatcher m({"", "x"});  // an empty string that slipped past validate() is ignored
  CHECK(m.push("abx") == "ab");
  CHECK(m.stop_index() == 1);
  CHECK(m.push("more") == "");
  CHECK(m.flush() == "");
  m.reset();
  CHECK(!m.stopped());
  CHECK(m.push("yy") == "yy");
}
