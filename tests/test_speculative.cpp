// Speculative decoding: the n-gram drafter and the rejection rule in isolation, then on the real
// pair llama-target / llama-draft through the scheduler — greedy output must be identical with
// and without speculation, sampled output must follow the target's distribution, and every KV
// block of both models must be free at the end.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "formats/weight_source.h"
#include "src/runtime/grammar/grammar.h"
#include "src/runtime/scheduler.h"
#include "src/runtime/speculative.h"
#include "tests/process.h"
#include "tests/test_models.h"
#include "tests/testdata.h"

using namespace kite;
using namespace kite::test;

namespace {

// --- the rejection rule, exactly ----------------------------------------------------------------

// P(emitted token) when x ~ q and the rule runs with uniforms on a fine grid (midpoints of
// n x n cells): converges to p for a correct rule. `wrong` replaces the residual by p itself.
std::map<int32_t, double> emitted_distribution(const std::vector<TokenProb>& p, const std::vector<TokenProb>& q, int n,
                                               bool wrong) {
  std::map<int32_t, double> out;
  std::vector<TokenProb> scratch;
  for (const TokenProb& xq : q)
    for (int a = 0; a < n; ++a)
      for (int d = 0; d < n; ++d) {
        const double ua = (a + 0.5) / n, ud = (d + 0.5) / n;
        int32_t t;
        if (wrong) {
          double px = 0;
          for (const auto& e : p) px += e.token == xq.token ? e.prob : 0;
          t = ua * xq.prob < px ? xq.token : draw_from(p, ud);
        } else {
          t = verify_proposal(p, xq.token, q, ua, ud, scratch).token;
        }
        out[t] += static_cast<double>(xq.prob) / (static_cast<double>(n) * n);
      }
  return out;
}

double tv_distance(const std::vector<TokenProb>& p, std::map<int32_t, double> got) {
  double tv = 0;
  for (const auto& e : p) {
    tv += std::abs(got[e.token] - e.prob);
    got.erase(e.token);
  }
  for (const auto& [t, v] : got) tv += v;
  return tv / 2;
}

}  // namespace

TEST_CASE("speculative: the rejection rule gives exactly the target's distribution") {
  const std::vector<TokenProb> p = {{3, 0.5f}, {7, 0.3f}, {9, 0.15f}, {11, 0.05f}};
  const std::vector<TokenProb> q = {{3, 0.2f}, {7, 0.6f}, {12, 0.2f}};  // 12: a token p excludes
  const double tv = tv_distance(p, emitted_distribution(p, q, 200, false));
  CHECK(tv < 0.01);
  // The same with a wrong rule (resample from p on rejection) is far off: the test can fail.
  const double tv_wrong = tv_distance(p, emitted_distribution(p, q, 200, true));
  CHECK(tv_wrong > 0.1);

  // One-hot proposals (n-gram): accept with probability p(x), else draw from p without x.
  const std::vector<TokenProb> one = {{7, 1.f}};
  CHECK(tv_distance(p, emitted_distribution(p, one, 200, false)) < 0.01);
  std::vector<TokenProb> scratch;
  CHECK(verify_proposal(p, 7, {}, 0.29, 0.5, scratch).accepted);
  const Verdict rej = verify_proposal(p, 7, {}, 0.31, 0.99, scratch);
  CHECK_FALSE(rej.accepted);
  CHECK(rej.token != 7);
  // A proposal the target bans is never accepted; p = q always accepts.
  CHECK_FALSE(verify_proposal(p, 12, q, 0.0, 0.5, scratch).accepted);
  CHECK(verify_proposal(p, 9, p, 0.999, 0.5, scratch).accepted);
}

TEST_CASE("speculative: n-gram index proposes what followed the longest earlier suffix") {
  NgramIndex idx(1, 3);
  std::vector<int32_t> t = {5, 6, 7, 8, 9, 1, 6, 7, 2, 5, 6, 7};
  idx.update(t);
  std::vector<int32_t> out;
  // Suffix 5 6 7 occurred at the start, followed by 8 9 1 ... (n == n_max: up to max).
  CHECK(idx.propose(t, 3, out) == 3);
  CHECK(out == std::vector<int32_t>{8, 9, 1});
  out.clear();
  CHECK(idx.propose(t, 8, out) == 8);  // it runs on into the later text, up to the end
  CHECK(out == std::vector<int32_t>{8, 9, 1, 6, 7, 2, 5, 6});
  // Incremental: after appending 4, no 2..3-gram "7 4" or "4" occurred before.
  t.push_back(4);
  idx.update(t);
  out.clear();
  CHECK(idx.propose(t, 4, out) == 0);
  // Only the 1-gram "6" matches now (always followed by 7): a 1-token match proposes 1 token.
  t.push_back(6);
  idx.update(t);
  out.clear();
  CHECK(idx.propose(t, 2, out) == 1);
  CHECK(out == std::vector<int32_t>{7});
  // Proposals stop at the end of the sequence.
  std::vector<int32_t> r = {1, 2, 3, 1, 2};
  NgramIndex i2(1, 2);
  i2.update(r);
  out.clear();
  CHECK(i2.propose(r, 8, out) == 3);
  CHECK(out == std::vector<int32_t>{3, 1, 2});
}

TEST_CASE("speculative: n-gram lookup refuses ambiguous contexts and drafts no longer than its match") {
  std::vector<int32_t> out;
  // "1 2" was followed by 3 and later by 4: a sequence ending in "1 2" gets no proposal, though
  // its most recent occurrence has a continuation (the old rule proposed 4 5 6 7 1 2).
  const std::vector<int32_t> t = {1, 2, 3, 9, 1, 2, 4, 5, 6, 7, 1, 2};
  NgramIndex amb(1, 2);
  amb.update(t);
  CHECK(amb.propose(t, 8, out) == 0);
  CHECK(out.empty());
  // A longer context disambiguates: "9 1 2" was only followed by 4, and every 3-gram after it
  // occurred once, so the copy runs to the end of the sequence.
  const std::vector<int32_t> u = {1, 2, 3, 9, 1, 2, 4, 5, 6, 7, 9, 1, 2};
  NgramIndex longer(1, 3);
  longer.update(u);
  CHECK(longer.propose(u, 8, out) == 7);
  CHECK(out == std::vector<int32_t>{4, 5, 6, 7, 9, 1, 2});
  // The copy stops before the first ambiguous context: after "7 8" -> 1 2 comes "1 2", which
  // was followed by both 3 and 4.
  const std::vector<int32_t> v = {7, 8, 1, 2, 3, 5, 8, 1, 2, 4, 0, 7, 8};
  NgramIndex stop(1, 2);
  stop.update(v);
  out.clear();
  CHECK(stop.propose(v, 8, out) == 2);
  CHECK(out == std::vector<int32_t>{1, 2});
  // A 1-token match drafts 1 token when longer matches were possible (n_max 3) ...
  const std::vector<int32_t> w = {5, 6, 7, 8, 9, 2, 5};
  NgramIndex short_match(1, 3);
  short_match.update(w);
  out.clear();
  CHECK(short_match.propose(w, 8, out) == 1);
  CHECK(out == std::vector<int32_t>{6});
  // ... and up to max when it is the longest size looked up.
  NgramIndex only_one(1, 1);
  only_one.update(w);
  out.clear();
  CHECK(only_one.propose(w, 8, out) == 6);
  CHECK(out == std::vector<int32_t>{6, 7, 8, 9, 2, 5});
}

TEST_CASE("speculative: fruitless probes back off exponentially, a success resets") {
  // The policy object alone, deterministically: a drafter that is never right, over n steps.
  auto probes_over = [](int32_t n, int32_t cap, int32_t accepted) {
    ProbeBackoff b;
    int32_t probes = 0;
    for (int32_t step = 0; step < n; ++step)
      if (b.ready()) ++probes, b.record(accepted, cap);
    return probes;
  };
  for (int32_t n : {100, 1000, 10000}) {
    const int32_t p = probes_over(n, 1 << 20, 0);
    CAPTURE(n);
    CHECK(p <= static_cast<int32_t>(std::log2(n)) + 1);  // O(log n): waits 1, 2, 4, ...
    CHECK(p >= static_cast<int32_t>(std::log2(n)) - 1);  // and it does keep probing
  }
  CHECK(probes_over(1000, 1, 0) == 500);                   // cap 1: every other step
  const int32_t capped = probes_over(10000, 64, 0);        // the cap bounds the wait
  CHECK(capped >= 10000 / 65);
  CHECK(capped <= 10000 / 65 + 8);
  CHECK(probes_over(1000, 64, 2) == 1000);                 // a drafter that pays drafts every step
  // The waits, exactly: 1, 2, 4, 8, then the cap (8).
  ProbeBackoff b;
  std::vector<int32_t> waits;
  for (int i = 0; i < 6; ++i) {
    REQUIRE(b.ready());
    b.record(0, 8);
    waits.push_back(b.wait());
    while (!b.ready()) {
    }
  }
  CHECK(waits == std::vector<int32_t>{1, 2, 4, 8, 8, 8});
  // One accepted proposal keeps the level; two or more reset it: the next probe is due at
  // once and the next failure waits 1 step.
  b.record(1, 8);
  CHECK(b.wait() == 8);
  while (!b.ready()) {
  }
  b.record(2, 8);
  CHECK(b.wait() == 0);
  CHECK(b.ready());
  b.record(0, 8);
  CHECK(b.wait() == 1);
}

TEST_CASE("speculative: draft lengths follow acceptance and cost") {
  std::vector<int32_t> k(2);
  const std::vector<int32_t> max_k = {8, 8};
  StepCost memory_bound{1.0, 0.01, 0.05, 0.001};
  plan_draft_lengths(std::vector<double>{0.9, 0.1}, max_k, 2, memory_bound, 64, k);
  CHECK(k[0] >= 4);    // a good drafter gets a long draft,
  CHECK(k[0] > k[1]);  // a bad one a shorter one
  StepCost compute_bound{0.01, 1.0, 0.0, 0.3};
  plan_draft_lengths(std::vector<double>{0.9, 0.1}, max_k, 2, compute_bound, 64, k);
  CHECK(k[0] == 0);  // extra rows cost as much as a step: never pays
  CHECK(k[1] == 0);
  plan_draft_lengths(std::vector<double>{0.9, 0.9}, max_k, 2, memory_bound, 5, k);
  CHECK(k[0] + k[1] <= 5);  // the step budget
  // A fit that measured extra rows as free still drafts (a row is never taken as costing 0,
  // which would make every proposal's gain per cost undefined and none chosen).
  StepCost free_rows{1.0, 0.0, 0.0, 0.0};
  plan_draft_lengths(std::vector<double>{0.6, 0.6}, max_k, 2, free_rows, 64, k);
  CHECK(k[0] >= 4);
  CHECK(k[1] >= 4);
  // A draft model that must first feed 200 tokens of a sequence (a new prompt, a catch-up after
  // a back-off) charges them to that sequence's first proposal: the caught-up one drafts, the
  // other does not.
  StepCost draft_pair{1.0, 0.05, 0.1, 0.02};
  plan_draft_lengths(std::vector<double>{0.8, 0.8}, max_k, 2, draft_pair, 64, k, std::vector<int64_t>{1, 200});
  CHECK(k[0] >= 2);
  CHECK(k[1] == 0);
  plan_draft_lengths(std::vector<double>{0.8, 0.8}, max_k, 2, draft_pair, 64, k, std::vector<int64_t>{1, 1});
  CHECK(k[1] == k[0]);
}

TEST_CASE("speculative: the step cost fit follows each size's usual time, not its outliers") {
  // A decode step of n tokens costs 1.0 + 0.1 n ms; one in five is stalled 5-20x (a loaded
  // machine), and the first of each size built its graph (10x).
  auto cost = [](int n) { return (1.0 + 0.1 * n) * 1e-3; };
  StepCostFit f;
  CHECK_FALSE(f.ready());
  uint64_t rng = 7;
  auto stall = [&rng] {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (rng >> 33) % 5 == 0 ? 5.0 + static_cast<double>((rng >> 40) % 16) : 1.0;
  };
  f.add(1, 10 * cost(1));
  for (int i = 0; i < 200; ++i) f.add(1, cost(1) * stall());
  CHECK_FALSE(f.ready());  // one size: no slope yet
  CHECK(f.mean_seconds() == doctest::Approx(cost(1)).epsilon(0.01));
  // One slow first step of a new size must not set the slope (a plain least-squares fit over
  // the raw times would make an extra token cost ~5 steps here).
  f.add(3, 10 * cost(3));
  CHECK_FALSE(f.ready());
  for (int i = 0; i < 40; ++i) f.add(3, cost(3) * stall());
  for (int i = 0; i < 40; ++i) f.add(9, cost(9) * stall());
  REQUIRE(f.ready());
  CHECK(f.a() == doctest::Approx(1.0e-3).epsilon(0.02));
  CHECK(f.b() == doctest::Approx(0.1e-3).epsilon(0.05));
  // A sustained change (the machine got slower) is followed within a window.
  for (int i = 0; i < StepCostFit::kWindow; ++i) f.add(1, 2 * cost(1)), f.add(3, 2 * cost(3)), f.add(9, 2 * cost(9));
  CHECK(f.a() == doctest::Approx(2.0e-3).epsilon(0.02));
  CHECK(f.b() == doctest::Approx(0.2e-3).epsilon(0.05));
}

namespace {

struct Engine {
  std::shared_ptr<const Model> target, draft;
  std::shared_ptr<const Tokenizer> tok;
};

const Engine& engine() {
  static Engine e = [] {
    Engine x;
    x.target = load_model("models/llama-target").model;
    x.tok = load_model("models/llama-target").tok;
    x.draft = load_model("models/llama-draft").model;
    return x;
  }();
  return e;
}

std::unique_ptr<Context> make_context(const std::shared_ptr<const Model>& m, int32_t n_seqs) {
  ContextOptions o;
  o.n_ctx = 256;
  o.n_seqs = n_seqs;
  o.n_threads = 2;
  auto c = Context::create(m, o);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.error().message));
  return std::move(*c);
}

// The reference prompts plus cuts of the held-out text.
std::vector<std::vector<int32_t>> prompts(size_t n) {
  const auto ref = nlohmann::json::parse(read_file(testdata("models/llama-target/reference.json")));
  static const std::string text = read_file(testdata("heldout.txt"));
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : ref["prompts"]) {
    if (out.size() == n) break;
    out.push_back(p["ids"].get<std::vector<int32_t>>());
  }
  for (size_t i = 0; out.size() < n; ++i)
    out.push_back(engine().tok->encode(text.substr(i * 1231 % 50000, 80 + i * 37 % 200)));
  return out;
}

struct Run {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;  // of each token (NaN-free only with n_logprobs > 0)
  SchedulerStats stats;
};

Run run_all(Context& ctx, Context* draft, const std::vector<std::vector<int32_t>>& ps, const SchedulerOptions& so,
            const GenerationParams& gp) {
  REQUIRE(Scheduler::check_speculative(so, ctx, draft).ok());
  Scheduler s(ctx, engine().tok, so, draft);
  Run r;
  r.tokens.resize(ps.size());
  r.logprobs.resize(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    Request q;
    q.prompt = ps[i];
    q.params = gp;
    q.on_event = [&r, i](const StreamEvent& e) {
      if (e.token >= 0) r.tokens[i].push_back(e.token), r.logprobs[i].push_back(e.logprob);
    };
    auto id = s.submit(std::move(q));
    REQUIRE_MESSAGE(id.ok(), (id.ok() ? std::string() : id.error().message));
  }
  auto st = s.run_until_idle();
  REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
  r.stats = s.stats();
  return r;
}

}  // namespace

TEST_CASE("speculative: greedy drafts come from each row's best logit, biased or sampled ones from whole rows") {
  auto draft = make_context(engine().draft, 2);
  auto ref = make_context(engine().draft, 1);
  SamplerParams sp;  // a sampling sequence: greedy drafts all the same
  sp.temperature = 1.f, sp.top_k = 0, sp.top_p = 1.f, sp.min_p = 0.f;
  // The draft's greedy continuation of `tokens`, a logit bias applied (eval, whole rows).
  auto reference = [&](std::vector<int32_t> tokens, int32_t k, const std::vector<LogitBias>& bias) {
    std::vector<int32_t> out;
    for (int32_t j = 0; j < k; ++j) {
      ref->kv().clear(0);
      REQUIRE(ref->eval(tokens).ok());
      std::vector<float> l(ref->logits(0).begin(), ref->logits(0).end());
      for (const LogitBias& b : bias) l[static_cast<size_t>(b.token)] += b.bias;
      out.push_back(Sampler::argmax(l));
      tokens.push_back(out.back());
    }
    return out;
  };
  const auto ps = prompts(2);
  const std::vector<int32_t> plain = reference(ps[0], 5, {});
  for (const bool biased : {false, true}) {
    CAPTURE(biased);
    SamplerParams p = sp;
    if (biased) p.logit_bias = {{plain[0], -INFINITY}, {plain[1], -2.f}};  // (a banned first choice)
    SpeculativeOptions so;
    so.mode = SpecMode::kDraft;
    so.p_min = 0.f;
    DraftModel dm(*draft, so);
    Sampler s0(p), s1(sp);
    Draft d0, d1;
    std::vector<DraftModel::Item> items = {{0, ps[0], 5, &s0, &d0}, {1, ps[1], 5, &s1, &d1}};
    SpecStats st;
    REQUIRE(dm.propose(items, st).ok());
    CHECK(d0.tokens == reference(ps[0], 5, p.logit_bias));
    CHECK(d1.tokens == reference(ps[1], 5, {}));
    CHECK((d0.q.empty() && d1.q.empty()));  // one-hot: verified by the rows' own samples
    // The last draft step's rows stayed on the device as their best logit, but for the bias.
    CHECK(draft->has_logits(0) == biased);
    CHECK_FALSE(draft->has_logits(1));
    dm.reset(0), dm.reset(1);
  }
  SpeculativeOptions so;
  so.mode = SpecMode::kDraft;
  so.p_min = 0.f;
  so.sample_drafts = true;
  DraftModel dm(*draft, so);
  Sampler s0(sp);
  Draft d0;
  std::vector<DraftModel::Item> items = {{0, ps[0], 5, &s0, &d0}};
  SpecStats st;
  REQUIRE(dm.propose(items, st).ok());
  CHECK(d0.tokens.size() == 5);
  CHECK(d0.q.size() == 5);  // each drawn from its distribution, from whole rows
  CHECK(draft->has_logits(0));
  dm.reset(0);
}

TEST_CASE("speculative: greedy output is identical with a draft model and with n-gram lookup, alone and 8 at once") {
  const auto ps = prompts(8);
  GenerationParams gp;
  gp.sampling.temperature = 0.f;
  gp.max_tokens = 40;
  gp.ignore_eos = true;
  auto target = make_context(engine().target, 8);
  auto draft = make_context(engine().draft, 8);
  const Run plain = run_all(*target, nullptr, ps, {}, gp);
  CHECK(plain.stats.drafted == 0);

  for (SpecMode mode : {SpecMode::kDraft, SpecMode::kNgram}) {
    CAPTURE(spec_mode_name(mode));
    SchedulerOptions so;
    so.speculative.mode = mode;
    so.speculative.adaptive = false;  // always draft: many rejections to roll back
    so.speculative.p_min = 0.f;
    so.speculative.max_draft = 6;
    Context* d = mode == SpecMode::kDraft ? draft.get() : nullptr;
    int top_k_steps = 0;  // greedy proposals are verified from each row's top 64 logits
    so.on_step = [&top_k_steps](const StepInfo& info) { top_k_steps += info.drafted > 0 && info.top_k > 0 ? 1 : 0; };
    const Run all = run_all(*target, d, ps, so, gp);
    for (size_t i = 0; i < ps.size(); ++i) CHECK_MESSAGE(all.tokens[i] == plain.tokens[i], "8 at once, prompt ", i);
    CHECK(top_k_steps > 0);
    SchedulerOptions whole_rows = so;
    whole_rows.top_k_outputs = 0;
    CHECK(run_all(*target, d, ps, whole_rows, gp).tokens == all.tokens);
    CHECK(all.stats.drafted > 0);
    CHECK(all.stats.accepted > 0);
    CHECK(all.stats.accepted < all.stats.drafted);  // rejections happened (and were rolled back)
    MESSAGE(std::string(spec_mode_name(mode)), ": drafted ", all.stats.drafted, ", accepted ", all.stats.accepted);
    int64_t alone_drafted = 0;
    for (size_t i : {size_t{1}, size_t{4}}) {
      const Run one = run_all(*target, d, {ps[i]}, so, gp);
      CHECK_MESSAGE(one.tokens[0] == plain.tokens[i], "alone, prompt ", i);
      MESSAGE(std::string(spec_mode_name(mode)), " alone, prompt ", i, ": drafted ", one.stats.drafted);
      if (mode == SpecMode::kDraft) CHECK(one.stats.drafted > 0);
      alone_drafted += one.stats.drafted;
    }
    CHECK(alone_drafted > 0);  // n-gram lookup proposes only where the text repeats unambiguously
    // Adaptive lengths: the same tokens whatever it decides.
    so.speculative.adaptive = true;
    const Run adaptive = run_all(*target, d, ps, so, gp);
    for (size_t i = 0; i < ps.size(); ++i) CHECK(adaptive.tokens[i] == plain.tokens[i]);
    // Rollback: nothing is left referenced in either cache.
    CHECK(target->kv().pool().n_referenced() == 0);
    CHECK(draft->kv().pool().n_referenced() == 0);
  }
}

TEST_CASE("speculative: a draft that never proposes backs off to O(log n) probes, one that is right keeps drafting") {
  // Decisions from the cost prior only (measure_cost = false): reproducible. The prior here is a
  // memory-bound machine's (an extra row or a draft step costs 1% of a step), where drafting
  // pays even at a low acceptance estimate, so only the back-off limits the probes.
  const auto ps = prompts(1);
  GenerationParams gp;
  gp.sampling.temperature = 0.f;
  gp.max_tokens = 160;
  gp.ignore_eos = true;
  auto target = make_context(engine().target, 1);
  auto draft = make_context(engine().draft, 1);
  const Run plain = run_all(*target, nullptr, ps, {}, gp);
  SchedulerOptions so;
  so.speculative.mode = SpecMode::kDraft;
  so.speculative.measure_cost = false;
  so.speculative.cost_prior = {1.0, 0.01, 0.01, 0.001};
  so.speculative.p_min = 1.f;  // the draft is never that sure: every probe comes back empty
  so.speculative.backoff_cap = 1 << 20;
  const Run never = run_all(*target, draft.get(), ps, so, gp);
  CHECK(never.tokens[0] == plain.tokens[0]);
  CHECK(never.stats.drafted == 0);
  MESSAGE("never proposes, 160 tokens: ", never.stats.draft_steps, " draft steps");
  CHECK(never.stats.draft_steps >= 4);
  CHECK(never.stats.draft_steps <= 9);  // log2(160) + 2: probes at steps 0, 2, 5, 10, 19, 36, 69, 134
  so.speculative.backoff_cap = 1;       // without the growing wait: a probe every other step
  const Run eager = run_all(*target, draft.get(), ps, so, gp);
  CHECK(eager.tokens[0] == plain.tokens[0]);
  CHECK(eager.stats.draft_steps >= 70);

  // A tiny catch-up window: after each back-off the draft restarts from the last 3 tokens.
  // Proposals get worse, the output stays the target's.
  so.speculative.p_min = 0.f;
  so.speculative.backoff_cap = 8;
  so.speculative.draft_window = 3;
  const Run window = run_all(*target, draft.get(), ps, so, gp);
  CHECK(window.tokens[0] == plain.tokens[0]);
  CHECK(window.stats.drafted > 0);
  CHECK(draft->kv().pool().n_referenced() == 0);

  // The target as its own draft agrees with itself: it never backs off and keeps drafting.
  auto self = make_context(engine().target, 1);
  so.speculative.draft_window = SpeculativeOptions{}.draft_window;
  so.speculative.backoff_cap = SpeculativeOptions{}.backoff_cap;
  const Run same = run_all(*target, self.get(), ps, so, gp);
  CHECK(same.tokens[0] == plain.tokens[0]);
  MESSAGE("target as draft: drafted ", same.stats.drafted, ", accepted ", same.stats.accepted, " in ",
          same.stats.spec_steps, " steps");
  CHECK(same.stats.drafted >= 100);
  CHECK(same.stats.accepted >= same.stats.drafted * 9 / 10);
  CHECK(target->kv().pool().n_referenced() == 0);
  CHECK(self->kv().pool().n_referenced() == 0);
}

TEST_CASE("speculative: grammar-constrained and logprob requests verify each position like a plain step") {
  auto g = Grammar::from_json_schema(R"({"type":"object","properties":{"name":{"type":"string","maxLength":24},
    "lines":{"type":"array","items":{"type":"string","maxLength":30},"maxItems":3}},"required":["name","lines"]})");
  REQUIRE_MESSAGE(g.ok(), (g.ok() ? std::string() : g.error().message));
  const auto ps = prompts(4);
  GenerationParams gp;
  gp.sampling.temperature = 0.f;
  gp.sampling.n_logprobs = 2;
  gp.max_tokens = 48;
  gp.grammar = *g;
  auto target = make_context(engine().target, 4);
  auto draft = make_context(engine().draft, 4);
  const Run plain = run_all(*target, nullptr, ps, {}, gp);
  for (SpecMode mode : {SpecMode::kDraft, SpecMode::kNgram}) {
    SchedulerOptions so;
    so.speculative.mode = mode;
    so.speculative.adaptive = false;
    so.speculative.p_min = 0.f;
    const Run spec = run_all(*target, mode == SpecMode::kDraft ? draft.get() : nullptr, ps, so, gp);
    for (size_t i = 0; i < ps.size(); ++i) {
      CHECK(spec.tokens[i] == plain.tokens[i]);
      CHECK(spec.logprobs[i] == plain.logprobs[i]);  // each from its own position's logits
      CHECK(plain.logprobs[i].size() > 0);
    }
    CHECK(spec.stats.drafted > 0);
  }
}

TEST_CASE("speculative: a tiny KV pool drafts less instead of preempting, with the same greedy tokens") {
  const auto ps = prompts(8);
  GenerationParams gp;
  gp.sampling.temperature = 0.f;
  gp.max_tokens = 24;
  gp.ignore_eos = true;
  ContextOptions o;
  o.n_ctx = 256;
  o.n_seqs = 8;
  o.n_threads = 2;
  o.kv_blocks = 48;
  o.prefix_cache = false;
  auto plain_ctx = Context::create(engine().target, o);
  REQUIRE(plain_ctx.ok());
  const Run plain = run_all(**plain_ctx, nullptr, ps, {}, gp);
  auto spec_ctx = Context::create(engine().target, o);
  REQUIRE(spec_ctx.ok());
  auto draft = make_context(engine().draft, 8);
  SchedulerOptions so;
  so.speculative.mode = SpecMode::kDraft;
  so.speculative.adaptive = false;
  so.speculative.p_min = 0.f;
  const Run spec = run_all(**spec_ctx, draft.get(), ps, so, gp);
  for (size_t i = 0; i < ps.size(); ++i) CHECK(spec.tokens[i] == plain.tokens[i]);
  CHECK(spec.stats.drafted > 0);
  CHECK(spec.stats.preemptions <= plain.stats.preemptions);  // drafts never cause a preemption
  CHECK((*spec_ctx)->kv().pool().n_referenced() == 0);
  CHECK(draft->kv().pool().n_referenced() == 0);
}

namespace {

// Pearson's chi-square of `counts` (n samples) against `p`, over the tokens expected >= 5 times
// plus one bin pooling the rest. Adds the statistic and the degrees of freedom.
void chi_square(const std::vector<TokenProb>& p, const std::map<int32_t, int64_t>& counts, int64_t n, double* chi2,
                double* dof) {
  double rest_p = 0;
  int64_t rest_n = n;
  int bins = 0;
  for (const TokenProb& e : p) {
    const double expect = e.prob * static_cast<double>(n);
    if (expect < 5) {
      rest_p += e.prob;
      continue;
    }
    const auto it = counts.find(e.token);
    const double got = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    rest_n -= static_cast<int64_t>(got);
    *chi2 += (got - expect) * (got - expect) / expect;
    ++bins;
  }
  const double rest_expect = rest_p * static_cast<double>(n);
  if (rest_expect >= 1) *chi2 += (rest_n - rest_expect) * (rest_n - rest_expect) / rest_expect, ++bins;
  *dof += bins - 1;
}

}  // namespace

TEST_CASE("speculative: sampled proposals verified from each row's top 64 logits give the tokens of whole rows") {
  // llama.cpp's sampling defaults (top-k 40: the rows' top 64 hold the whole distribution),
  // seeded, with logprobs; proposals from a draft model (sampled or greedy) and from n-gram
  // lookup. Greedy drafts and n-gram proposals are verified by the rows' own samples, so their
  // rows also come back as draws made on the device (the OpenAI API's defaults) and as top
  // logits fetched whole where needed (top-p).
  const auto ps = prompts(6);
  GenerationParams llama;
  llama.sampling.n_logprobs = 2;
  llama.max_tokens = 32;
  llama.ignore_eos = true;
  GenerationParams openai = llama;
  openai.sampling.temperature = 1.f, openai.sampling.top_k = 0, openai.sampling.top_p = 1.f, openai.sampling.min_p = 0.f;
  GenerationParams top_p = openai;
  top_p.sampling.top_p = 0.9f, top_p.sampling.n_logprobs = 0;
  auto target = make_context(engine().target, 6);
  auto draft = make_context(engine().draft, 6);
  struct Case {
    const char* what;
    SpecMode mode;
    const GenerationParams& gp;
    bool sampled = false;  // sampled drafts
  };
  for (const Case& c : {Case{"sampled drafts, top-k 40", SpecMode::kDraft, llama, true},
                        Case{"greedy drafts, top-k 40", SpecMode::kDraft, llama},
                        Case{"greedy drafts, plain temperature", SpecMode::kDraft, openai},
                        Case{"greedy drafts, top-p 0.9", SpecMode::kDraft, top_p},
                        Case{"n-gram, top-k 40", SpecMode::kNgram, llama},
                        Case{"n-gram, plain temperature", SpecMode::kNgram, openai},
                        Case{"n-gram, top-p 0.9", SpecMode::kNgram, top_p}}) {
    CAPTURE(std::string(c.what));
    SchedulerOptions so;
    so.speculative.mode = c.mode;
    so.speculative.sample_drafts = c.sampled;
    so.speculative.adaptive = false;
    so.speculative.p_min = 0.f;
    int top_steps = 0, other_steps = 0, drawn = 0;  // steps with proposals
    so.on_step = [&](const StepInfo& info) {
      if (info.drafted == 0) return;
      (info.top_k == 64 && info.whole_rows == 0 ? top_steps : other_steps) += 1;
      drawn += info.device_draws;
    };
    Context* d = c.mode == SpecMode::kDraft ? draft.get() : nullptr;
    const Run top = run_all(*target, d, ps, so, c.gp);
    CHECK(top_steps > 0);
    CHECK(other_steps == 0);
    if (&c.gp == &openai) CHECK(drawn > 0);
    SchedulerOptions whole_rows = so;
    whole_rows.top_k_outputs = 0;
    whole_rows.on_step = nullptr;
    const Run whole = run_all(*target, d, ps, whole_rows, c.gp);
    for (size_t i = 0; i < ps.size(); ++i) {
      INFO("prompt ", i);
      CHECK(top.tokens[i] == whole.tokens[i]);
      REQUIRE(top.logprobs[i].size() == whole.logprobs[i].size());
      if (c.gp.sampling.n_logprobs > 0)
        for (size_t j = 0; j < top.logprobs[i].size(); ++j) CHECK(std::abs(top.logprobs[i][j] - whole.logprobs[i][j]) < 1e-4f);
    }
    CHECK(top.stats.drafted > 0);
    CHECK(top.stats.accepted < top.stats.drafted);
    CHECK(top.stats.drafted == whole.stats.drafted);
  }
}

namespace {

struct ChiSquare {
  double chi2 = 0, dof = 0;
  int64_t used = 0;  // samples in the groups counted
  SchedulerStats stats;
};

// kChoices choices of each of kRequests requests for one prompt at sampling `sp` with `mode`'s
// proposals (the draft model's or n-gram lookup's, at most one: the second token is verified,
// the third the bonus). The first token is sampled in the prompt step (no speculation); grouped
// by it, the second token's frequencies must match p(. | prompt, first) computed directly: a
// pooled chi-square over the groups with at least 40 samples.
ChiSquare second_token_chi_square(SpecMode mode, const SamplerParams& sp, bool sample_drafts = false) {
  constexpr int kRequests = 60, kChoices = 64;
  auto ref = make_context(engine().target, 1);
  auto dist = [&](const std::vector<int32_t>& tokens) {
    ref->kv().clear(0);
    REQUIRE(ref->eval(tokens).ok());
    std::vector<float> l(ref->logits(0).begin(), ref->logits(0).end());
    std::vector<TokenProb> p;
    Sampler(sp).distribution_in_place(l, p);
    return p;
  };
  // The reference prompt whose most likely first token is likeliest: most samples per group.
  std::vector<int32_t> prompt;
  float best = 0;
  for (const auto& cand : prompts(8)) {
    const std::vector<TokenProb> p0 = dist(cand);
    const float top = std::max_element(p0.begin(), p0.end(), [](auto a, auto b) { return a.prob < b.prob; })->prob;
    if (top > best) best = top, prompt = cand;
  }

  auto target = make_context(engine().target, kChoices);
  auto draft = mode == SpecMode::kDraft ? make_context(engine().draft, kChoices) : nullptr;
  SchedulerOptions so;
  so.speculative.mode = mode;
  so.speculative.adaptive = false;
  so.speculative.p_min = 0.f;
  so.speculative.ngram_min = 1;  // (a first token seen in the prompt proposes what followed it)
  so.speculative.sample_drafts = sample_drafts;
  GenerationParams gp;
  gp.sampling = sp;
  gp.max_tokens = 3;
  gp.ignore_eos = true;
  gp.n = kChoices;
  Scheduler s(*target, engine().tok, so, draft.get());
  std::map<std::pair<uint64_t, int32_t>, std::vector<int32_t>> out;
  for (int rep = 0; rep < kRequests; ++rep) {
    Request r;
    r.prompt = prompt;
    r.params = gp;
    r.params.sampling.seed = 1000 + static_cast<uint64_t>(rep) * 977;
    r.on_event = [&out](const StreamEvent& e) {
      if (e.token >= 0) out[{e.request, e.choice}].push_back(e.token);
    };
    REQUIRE(s.submit(std::move(r)).ok());
  }
  REQUIRE(s.run_until_idle().ok());
  std::map<int32_t, std::map<int32_t, int64_t>> by_first;
  for (const auto& [key, toks] : out) {
    REQUIRE(toks.size() == 3);
    ++by_first[toks[0]][toks[1]];
  }
  ChiSquare r;
  r.stats = s.stats();
  const std::string what = std::string(spec_mode_name(mode)) + (sample_drafts ? " (sampled)" : "");
  MESSAGE(what, ": drafted ", r.stats.drafted, ", accepted ", r.stats.accepted, "; ", by_first.size(),
          " distinct first tokens");
  for (const auto& [first, counts] : by_first) {
    int64_t n = 0;
    for (const auto& [t, c] : counts) n += c;
    if (n < 40) continue;
    std::vector<int32_t> cond = prompt;
    cond.push_back(first);
    chi_square(dist(cond), counts, n, &r.chi2, &r.dof);
    r.used += n;
  }
  MESSAGE("chi2 ", r.chi2, " with ", r.dof, " degrees of freedom over ", r.used, " samples");
  CHECK(target->kv().pool().n_referenced() == 0);
  if (draft) CHECK(draft->kv().pool().n_referenced() == 0);
  return r;
}

}  // namespace

TEST_CASE("speculative: sampled tokens follow the target's distribution (chi-square, draft model proposals)") {
  // Temperature 1.5 over the whole vocabulary: many second tokens are likely and proposals are
  // often rejected. Sampled drafts: a proposal is accepted with min(1, p/q), else the token is
  // drawn from the residual (measured: 104 with 95 degrees of freedom, bound 150; resampling from
  // p instead of the residual on rejection gives 181 and fails). Greedy drafts (the default): the
  // draft's best token, kept when the row's own sample is that token.
  SamplerParams sp;
  sp.temperature = 1.5f, sp.top_k = 0, sp.top_p = 1.f, sp.min_p = 0.f;
  for (const bool sampled : {true, false}) {
    CAPTURE(sampled);
    const ChiSquare r = second_token_chi_square(SpecMode::kDraft, sp, sampled);
    CHECK(r.stats.drafted >= 2000);  // nearly every choice verified a proposal
    CHECK(r.stats.accepted > 0);
    CHECK(r.stats.accepted < r.stats.drafted);  // the rejection path ran
    REQUIRE(r.used >= 1000);
    REQUIRE(r.dof >= 15);
    CHECK(r.chi2 < r.dof + 4 * std::sqrt(2 * r.dof));  // about p < 1e-4 for a correct rule
  }
}

TEST_CASE("speculative: sampled tokens follow the target's distribution (chi-square, n-gram proposals)") {
  // An n-gram proposal is certain (q one-hot): kept when the row's own sample is that token.
  // Plain temperature (drawn on the device's path where the top k come back) and top-p (from
  // the top 64, fetched past them).
  SamplerParams plain;
  plain.temperature = 1.5f, plain.top_k = 0, plain.top_p = 1.f, plain.min_p = 0.f;
  SamplerParams top_p = plain;
  top_p.temperature = 1.f, top_p.top_p = 0.95f;
  for (const SamplerParams& sp : {plain, top_p}) {
    CAPTURE(sp.top_p);
    const ChiSquare r = second_token_chi_square(SpecMode::kNgram, sp);
    CHECK(r.stats.drafted >= 1000);
    CHECK(r.stats.accepted > 0);
    CHECK(r.stats.accepted < r.stats.drafted);
    REQUIRE(r.used >= 1000);
    REQUIRE(r.dof >= 10);
    CHECK(r.chi2 < r.dof + 4 * std::sqrt(2 * r.dof));
  }
}

TEST_CASE("speculative: kite run --spec ngram prints the same text and its acceptance, bad flags are usage errors") {
  // The bf16 model: with quantized weights, one row (decode) and several (verification) go
  // through different activation formats in the CPU matmul (ops_matmul.cpp: q8 per group
  // against the gemm8/tile formats), so a near-tie can flip between plain and speculative
  // greedy decoding (llama-target-Q4_K_M.gguf on this prompt does, with several drafters).
  const std::string m = testdata("models/llama-target");
  const std::string prompt = "First Citizen:\nFirst Citizen:\nFirst Citizen:\n";
  auto plain = run_kite({"run", "-m", m, "-p", prompt, "-n", "32", "--temp", "0", "--ignore-eos"});
  REQUIRE(plain.exit_code == 0);
  auto spec = run_kite({"run", "-m", m, "-p", prompt, "-n", "32", "--temp", "0", "--ignore-eos", "--spec", "ngram",
                        "--draft-fixed", "--ngram-min", "2", "--ngram-max", "6"});
  INFO(spec.err);
  REQUIRE(spec.exit_code == 0);
  CHECK(spec.out == plain.out);
  CHECK(spec.err.find("speculative (ngram): drafted ") != std::string::npos);
  CHECK(spec.err.find("drafted 0,") == std::string::npos);  // the repeated prompt does get proposals

  auto sizes = run_kite({"run", "-m", m, "-p", "hi", "--spec", "ngram", "--ngram-min", "5", "--ngram-max", "2"});
  CHECK(sizes.exit_code == 2);
  CHECK(sizes.err.find("ngram_min <= ngram_max") != std::string::npos);
  auto no_draft = run_kite({"run", "-m", m, "-p", "hi", "--spec", "draft"});
  CHECK(no_draft.exit_code == 2);
  CHECK(no_draft.err.find("--spec draft needs --draft MODEL") != std::string::npos);
  auto rule = run_kite({"run", "-m", m, "-p", "hi", "--spec", "ngram", "--draft-sampling", "residual"});
  CHECK(rule.exit_code == 2);
  CHECK(rule.err.find("--draft-sampling") != std::string::npos);
}
