// Continuous batching on a real model (llama-target): concurrency, chunked prefill, preemption,
// the prefix cache and forked choices must not change what a request generates.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "formats/weight_source.h"
#include "src/runtime/grammar/grammar.h"
#include "src/runtime/scheduler.h"
#include "tests/test_models.h"
#include "tests/testdata.h"

using namespace kite;
using namespace kite::test;

namespace {

const LoadedModel& engine() { return load_model("models/llama-target"); }

std::unique_ptr<Context> make_context(int32_t n_seqs, int64_t kv_blocks = 0, bool prefix_cache = true) {
  ContextOptions o;
  o.n_ctx = 512;
  o.n_seqs = n_seqs;
  o.kv_blocks = kv_blocks;
  o.prefix_cache = prefix_cache;
  o.n_threads = 2;
  auto c = Context::create(engine().model, o);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.error().message));
  return std::move(*c);
}

// Prompts of different lengths cut from the held-out text.
std::vector<std::vector<int32_t>> prompts(size_t n) {
  static const std::string text = read_file(testdata("heldout.txt"));
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < n; ++i) {
    const size_t start = (i * 997) % (text.size() - 2000);
    const size_t len = 20 + (i * 53) % 300;
    out.push_back(engine().tok->encode(text.substr(start, len)));
  }
  return out;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // (sampling.n_logprobs > 0)
  std::string text;
  FinishReason reason = FinishReason::kNone;
  int finished_events = 0;
};

struct Collector {
  std::map<std::pair<uint64_t, int32_t>, Outcome> by_choice;
  Outcome& at(uint64_t id, int32_t choice = 0) { return by_choice[{id, choice}]; }
  Request make(std::vector<int32_t> prompt, GenerationParams p) {
    Request r;
    r.prompt = std::move(prompt);
    r.params = std::move(p);
    r.on_event = [this](const StreamEvent& e) {
      Outcome& o = by_choice[{e.request, e.choice}];
      if (e.token >= 0) o.tokens.push_back(e.token), o.logprobs.push_back(e.logprob);
      o.text += e.text;
      if (e.finished) {
        o.reason = e.reason;
        ++o.finished_events;
      }
    };
    return r;
  }
  // Submits a request to `s` and remembers its choices in submission order (outcomes()).
  void submit(Scheduler& s, std::vector<int32_t> prompt, const GenerationParams& p) {
    auto id = s.submit(make(std::move(prompt), p));
    REQUIRE(id.ok());
    for (int32_t c = 0; c < p.n; ++c) order.emplace_back(*id, c);
  }
  std::vector<Outcome> outcomes() {
    std::vector<Outcome> out;
    for (const auto& [id, c] : order) out.push_back(at(id, c));
    return out;
  }
  std::vector<std::pair<uint64_t, int32_t>> order;
};

GenerationParams greedy(int32_t max_tokens) {
  GenerationParams p;
  p.sampling.temperature = 0.f;
  p.max_tokens = max_tokens;
  return p;
}

// Runs every prompt through one scheduler, all submitted at once.
std::vector<Outcome> run_all(Context& ctx, const std::vector<std::vector<int32_t>>& ps, const SchedulerOptions& so,
                             int32_t max_tokens, SchedulerStats* stats = nullptr) {
  Scheduler s(ctx, engine().tok, so);
  Collector col;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < ps.size(); ++i) {
    auto id = s.submit(col.make(ps[i], greedy(max_tokens + static_cast<int32_t>(i % 5) * 3)));
    REQUIRE_MESSAGE(id.ok(), (id.ok() ? std::string() : id.error().message));
    ids.push_back(*id);
  }
  auto st = s.run_until_idle();
  REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
  if (stats) *stats = s.stats();
  std::vector<Outcome> out;
  for (uint64_t id : ids) out.push_back(col.at(id, 0));
  return out;
}

}  // namespace

TEST_CASE("scheduler: 1, 4 and 16 concurrent sequences, chunked prefill and preemption give the same greedy tokens") {
  const auto ps = prompts(16);
  // Each prompt alone.
  std::vector<Outcome> alone;
  {
    auto ctx = make_context(1);
    for (size_t i = 0; i < ps.size(); ++i) {
      auto one = run_all(*ctx, {ps[i]}, {}, 24 + static_cast<int32_t>(i % 5) * 3);
      alone.push_back(one[0]);
    }
  }
  for (const Outcome& o : alone) {
    CHECK(o.finished_events == 1);
    CHECK(o.tokens.size() > 0);
  }
  auto check_same = [&](const std::vector<Outcome>& got, size_t first, const char* what) {
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK_MESSAGE(got[i].tokens == alone[first + i].tokens, what, ": prompt ", first + i);
      CHECK(got[i].finished_events == 1);
      CHECK(got[i].reason == alone[first + i].reason);
    }
  };
  {
    auto ctx = make_context(4);
    check_same(run_all(*ctx, {ps.begin(), ps.begin() + 4}, {}, 24), 0, "4 concurrent");
  }
  {
    auto ctx = make_context(16);
    check_same(run_all(*ctx, ps, {}, 24), 0, "16 concurrent");
    SchedulerOptions chunked;
    chunked.max_batch_tokens = 37;  // prompts arrive in chunks, mixed with decode tokens
    check_same(run_all(*ctx, ps, chunked, 24), 0, "16 concurrent, chunked prefill");
  }
  {
    // A pool far smaller than 16 sequences need: the scheduler must preempt and recompute.
    auto ctx = make_context(16, 40, /*prefix_cache=*/false);
    SchedulerStats stats;
    check_same(run_all(*ctx, ps, {}, 24, &stats), 0, "16 concurrent, tiny pool");
    CHECK(stats.preemptions > 0);
    CHECK(stats.min_pool_use_at_preemption >= 0.95);  // the pool is used up before anyone is preempted
    CHECK(ctx->kv().pool().n_referenced() == 0);  // everything released at the end
  }
}

TEST_CASE("scheduler: a shared 200-token prefix is computed once, with the same output") {
  const auto ps = prompts(40);
  std::vector<int32_t> prefix;
  for (const auto& p : ps) {
    prefix.insert(prefix.end(), p.begin(), p.end());
    if (prefix.size() >= 200) break;
  }
  prefix.resize(200);
  auto a = prefix, b = prefix;
  a.insert(a.end(), {450, 451, 452});
  b.insert(b.end(), {600, 601, 602, 603, 604});

  auto ctx = make_context(4);
  SchedulerStats s0, s1;
  run_all(*ctx, {a}, {}, 8, &s0);
  Scheduler sched(*ctx, engine().tok);
  Collector col;
  auto id = sched.submit(col.make(b, greedy(8)));
  REQUIRE(id.ok());
  REQUIRE(sched.run_until_idle().ok());
  s1 = sched.stats();
  const int64_t reused = (static_cast<int64_t>(b.size()) - 1) / 16 * 16;  // whole blocks of the prefix
  CHECK(reused == 192);
  // Computed: the new tokens of b after the reused blocks, plus one per generated token but the last.
  const Outcome& got = col.at(*id, 0);
  CHECK(s1.computed_tokens == static_cast<int64_t>(b.size()) - reused + static_cast<int64_t>(got.tokens.size()) - 1);

  auto plain = make_context(4, 0, /*prefix_cache=*/false);
  const auto without = run_all(*plain, {b}, {}, 8);
  CHECK(got.tokens == without[0].tokens);
}

TEST_CASE("scheduler: n choices fork the prompt's blocks, copy-on-write keeps every branch right") {
  const auto ps = prompts(3);
  auto ctx = make_context(8);
  GenerationParams p;
  p.sampling.temperature = 1.0f;
  p.sampling.top_k = 0;
  p.sampling.top_p = 1.f;
  p.sampling.min_p = 0.f;
  p.sampling.seed = 1234;
  p.max_tokens = 20;
  p.n = 3;
  Scheduler s(*ctx, engine().tok);
  Collector col;
  Usage usage;
  auto r = col.make(ps[1], p);
  int done_calls = 0;
  r.on_done = [&](const Usage& u) {
    usage = u;
    ++done_calls;
  };
  auto id = s.submit(std::move(r));
  REQUIRE(id.ok());
  REQUIRE(s.run_until_idle().ok());
  CHECK(done_calls == 1);
  CHECK(usage.prompt_tokens == static_cast<int64_t>(ps[1].size()));
  CHECK(ctx->kv().stats().cow_copies >= 2);  // the prompt's partial last block, once per branch
  int64_t total = 0;
  for (int32_t c = 0; c < 3; ++c) {
    // Choice c samples with seed + c: the same as a lone request with that seed.
    GenerationParams lone = p;
    lone.n = 1;
    lone.sampling.seed = p.sampling.seed + static_cast<uint64_t>(c);
    Scheduler s2(*ctx, engine().tok);
    Collector col2;
    auto id2 = s2.submit(col2.make(ps[1], lone));
    REQUIRE(id2.ok());
    REQUIRE(s2.run_until_idle().ok());
    const Outcome& got = col.at(*id, c);
    CHECK_MESSAGE(got.tokens == col2.at(*id2, 0).tokens, "choice ", c);
    CHECK(got.finished_events == 1);
    total += static_cast<int64_t>(got.tokens.size());
  }
  CHECK(usage.completion_tokens == total);
  CHECK(col.at(*id, 0).tokens != col.at(*id, 1).tokens);
}

TEST_CASE("scheduler: cancel frees the blocks at once, bad requests are refused with a reason") {
  const auto ps = prompts(2);
  auto ctx = make_context(2);
  SchedulerOptions so;
  so.max_queued = 2;
  Scheduler s(*ctx, engine().tok, so);
  Collector col;
  auto id = s.submit(col.make(ps[0], greedy(400)));
  REQUIRE(id.ok());
  for (int i = 0; i < 3; ++i) REQUIRE(s.step().ok());
  CHECK(ctx->kv().pool().n_referenced() > 0);
  s.cancel(*id);
  REQUIRE(s.step().ok());
  CHECK(ctx->kv().pool().n_referenced() == 0);
  CHECK(col.at(*id, 0).reason == FinishReason::kCancelled);
  CHECK(col.at(*id, 0).finished_events == 1);
  CHECK(s.idle());

  auto empty = s.submit(col.make({}, greedy(4)));
  CHECK(empty.error().code == ErrorCode::kInvalidArgument);
  auto huge = s.submit(col.make(std::vector<int32_t>(600, 5), greedy(4)));
  CHECK(huge.error().code == ErrorCode::kTooLarge);
  CHECK(huge.error().message.find("context holds 512") != std::string::npos);
  auto bad_token = s.submit(col.make({1, 999999}, greedy(4)));
  CHECK(bad_token.error().message.find("999999") != std::string::npos);
  GenerationParams many = greedy(4);
  many.n = 9;
  CHECK(s.submit(col.make(ps[0], many)).error().code == ErrorCode::kInvalidArgument);
  REQUIRE(s.submit(col.make(ps[0], greedy(4))).ok());
  REQUIRE(s.submit(col.make(ps[1], greedy(4))).ok());
  auto busy = s.submit(col.make(ps[1], greedy(4)));
  CHECK(busy.error().code == ErrorCode::kBusy);
  REQUIRE(s.run_until_idle().ok());
}

TEST_CASE("scheduler: stop strings, max tokens and the context end a request with the right reason") {
  const auto ps = prompts(1);
  auto ctx = make_context(2);
  const auto base = run_all(*ctx, ps, {}, 30);
  REQUIRE(base[0].text.size() > 12);
  const std::string stop = base[0].text.substr(6, 4);  // a stop string inside the greedy text
  Scheduler s(*ctx, engine().tok);
  Collector col;
  GenerationParams p = greedy(30);
  p.stop = {stop};
  auto id = s.submit(col.make(ps[0], p));
  GenerationParams q = greedy(3);
  auto id2 = s.submit(col.make(ps[0], q));
  REQUIRE(s.run_until_idle().ok());
  const Outcome& o = col.at(*id, 0);
  CHECK(o.reason == FinishReason::kStop);
  CHECK(o.text == base[0].text.substr(0, base[0].text.find(stop)));
  CHECK(col.at(*id2, 0).reason == FinishReason::kLength);
  CHECK(col.at(*id2, 0).tokens.size() == 3);
}

TEST_CASE("scheduler: a JSON schema constrains sampled output on a real model") {
  const char* schema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
    "age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3}},
    "required":["name","age"]})";
  auto g = Grammar::from_json_schema(schema);
  REQUIRE_MESSAGE(g.ok(), (g.ok() ? std::string() : g.error().message));
  auto ctx = make_context(8);
  Scheduler s(*ctx, engine().tok);
  Collector col;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 8; ++i) {
    GenerationParams p;
    p.sampling.temperature = 1.0f;
    p.sampling.seed = static_cast<uint64_t>(i);
    p.max_tokens = 200;
    p.grammar = *g;
    auto id = s.submit(col.make(engine().tok->encode("The record:"), p));
    REQUIRE(id.ok());
    ids.push_back(*id);
  }
  REQUIRE(s.run_until_idle().ok());
  int complete = 0;
  for (uint64_t id : ids) {
    const Outcome& o = col.at(id, 0);
    if (o.reason == FinishReason::kLength) continue;  // cut off: the schema was not finished
    CHECK(o.reason == FinishReason::kStop);
    ++complete;
    auto j = nlohmann::json::parse(o.text, nullptr, false);
    REQUIRE_MESSAGE(!j.is_discarded(), o.text);
    CHECK(j.is_object());
    CHECK(j["name"].is_string());
    CHECK(j["age"].is_number_integer());
  }
  CHECK(complete >= 4);
}

TEST_CASE("scheduler: rows sampled on several threads give the tokens and logprobs of one thread") {
  // Greedy, seeded temperature sampling with logprobs, penalties, a logit bias, a grammar (always
  // on the engine thread) and n = 2 choices (their first row is sampled there too), all at once.
  auto g = Grammar::from_json_schema(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  REQUIRE(g.ok());
  const auto ps = prompts(12);
  auto run = [&](int32_t threads) {
    auto ctx = make_context(16);
    SchedulerOptions so;
    so.sampling_threads = threads;
    so.parallel_sampling_floats = 1;  // (the test vocabulary is small: always take the parallel path)
    so.top_k_outputs = 0;             // (whole rows: top-k rows are not shared out)
    Scheduler s(*ctx, engine().tok, so);
    Collector col;
    for (size_t i = 0; i < ps.size(); ++i) {
      GenerationParams p = greedy(20);
      if (i % 2 == 1) {
        p.sampling.temperature = 0.9f;
        p.sampling.seed = i;
        p.sampling.n_logprobs = 3;
      }
      if (i % 3 == 0) p.sampling.repeat_penalty = 1.3f;
      if (i == 4) p.sampling.logit_bias = {{ps[4].back(), 5.f}};
      if (i == 5) p.grammar = *g;
      if (i == 7) p.n = 2;
      col.submit(s, ps[i], p);
    }
    REQUIRE(s.run_until_idle().ok());
    return col.outcomes();
  };
  const std::vector<Outcome> one = run(1), three = run(3);
  REQUIRE(one.size() == three.size());
  for (size_t i = 0; i < one.size(); ++i) {
    CHECK_MESSAGE(one[i].tokens == three[i].tokens, "request ", i);
    CHECK(one[i].text == three[i].text);
    CHECK(one[i].logprobs == three[i].logprobs);
    CHECK(one[i].reason == three[i].reason);
    CHECK(one[i].tokens.size() > 0);
  }
}

TEST_CASE("scheduler: rows brought back as their top 64 logits, or drawn on the device, give the tokens of whole rows") {
  // Beside them, rows that need their whole logits (penalties, a grammar with logprobs, a prompt
  // about to fork into choices that draw) come back whole in the same steps; rows of top-p or
  // min-p alone, or with a grammar, are fetched whole after the step where the top 64 fall short.
  auto g = Grammar::from_json_schema(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  REQUIRE(g.ok());
  const auto ps = prompts(12);
  int device_draws = 0, fetched_rows = 0;
  std::vector<size_t> from_top_outcomes;  // top-p, min-p, a grammar: rows fetched after the step where needed
  auto run = [&](int32_t top_k_outputs, std::vector<StepInfo>* steps) {
    auto ctx = make_context(16);
    SchedulerOptions so;
    so.top_k_outputs = top_k_outputs;
    if (top_k_outputs > 0) so.sampling_threads = 3, so.parallel_sampling_floats = 1;  // (fetched rows on the team)
    so.on_step = [&](const StepInfo& info) {
      steps->push_back(info);
      device_draws += info.device_draws;
      fetched_rows += info.fetched_rows;
    };
    Scheduler s(*ctx, engine().tok, so);
    Collector col;
    for (size_t i = 0; i < ps.size(); ++i) {
      GenerationParams p = greedy(i == 3 ? 6 : 24);
      if (i % 2 == 1) {  // llama.cpp's sampling defaults (top-k 40), seeded
        p.sampling = SamplerParams{};
        p.sampling.seed = i;
      }
      if (i == 2 || i == 5) p.sampling.n_logprobs = 4;
      if (i == 6 || i == 9 || i == 11) {  // the OpenAI API's defaults: temperature 1 over the whole row (drawn there)
        p.sampling = SamplerParams{};
        p.sampling.temperature = 1.f, p.sampling.top_k = 0, p.sampling.top_p = 1.f, p.sampling.min_p = 0.f;
        p.sampling.seed = 100 + i;
      }
      if (i == 7 || i == 11) p.n = 2;
      if (i == 9) p.sampling.n_logprobs = 3;  // (drawn there too, with logprobs)
      if (i == 1 || i == 4 || i == 8) {  // top-p and/or min-p without top-k: the row fetched when
        p.sampling = SamplerParams{};    // the nucleus reaches past the top 64
        p.sampling.top_k = 0, p.sampling.seed = 50 + i;
        if (i == 4) p.sampling.top_p = 1.f, p.sampling.min_p = 0.02f;
        if (i == 8) p.sampling.temperature = 1.2f, p.sampling.top_p = 0.9f, p.sampling.min_p = 0.f;
      }
      if (i == 3) p.sampling.repeat_penalty = 1.2f;
      if (i == 0 || i == 7 || i == 10) p.grammar = *g;  // greedy; top-k 40; with logprobs (whole rows)
      if (i == 10) p.sampling.n_logprobs = 2;
      if ((i == 0 || i == 1 || i == 4 || i == 7 || i == 8) && top_k_outputs > 0)
        for (int32_t c = 0; c < p.n; ++c) from_top_outcomes.push_back(col.order.size() + static_cast<size_t>(c));
      col.submit(s, ps[i], p);
    }
    REQUIRE(s.run_until_idle().ok());
    return col.outcomes();
  };
  std::vector<StepInfo> top_steps, whole_steps;
  const std::vector<Outcome> top = run(64, &top_steps), whole = run(0, &whole_steps);
  REQUIRE(top.size() == whole.size());
  for (size_t i = 0; i < top.size(); ++i) {
    INFO("request ", i);
    CHECK(top[i].tokens == whole[i].tokens);
    CHECK(top[i].text == whole[i].text);
    CHECK(top[i].reason == whole[i].reason);
    CHECK(top[i].tokens.size() > 0);
    REQUIRE(top[i].logprobs.size() == whole[i].logprobs.size());
    for (size_t j = 0; j < top[i].logprobs.size(); ++j) CHECK(std::abs(top[i].logprobs[j] - whole[i].logprobs[j]) < 1e-4f);
  }
  // Top-64 steps (1 when every row is greedy, without logprobs) with whole rows beside them
  // while the penalized and grammar requests ran, and the plain-temperature requests' tokens
  // drawn on the device; none of that without top-k outputs.
  auto count = [](const std::vector<StepInfo>& steps, auto pred) { return std::count_if(steps.begin(), steps.end(), pred); };
  CHECK(count(top_steps, [](const StepInfo& i) { return i.top_k == 64; }) > 10);
  CHECK(count(top_steps, [](const StepInfo& i) { return i.top_k == 64 && i.whole_rows > 0; }) > 5);
  CHECK(count(top_steps, [](const StepInfo& i) { return i.whole_rows > 0 && 2 * i.whole_rows < i.decode_rows; }) > 5);
  CHECK(device_draws > 5);
  // Some rows of those that may sample from their top 64 were fetched whole (on this tiny
  // model, the tokens a grammar forces are often past its top 64), not all (test_sampler counts).
  size_t from_top_tokens = 0;  // (the whole-row run fetches none)
  for (size_t o : from_top_outcomes) from_top_tokens += top[o].tokens.size();
  MESSAGE("rows fetched after their top 64: ", fetched_rows, " of ", from_top_tokens);
  CHECK(fetched_rows > 0);
  CHECK(fetched_rows < static_cast<int>(from_top_tokens));
  CHECK(count(whole_steps, [](const StepInfo& i) { return i.top_k == 0 && i.whole_rows == 0; }) ==
        static_cast<std::ptrdiff_t>(whole_steps.size()));
}

TEST_CASE("scheduler: forks, cancellations and preemption together leave nothing behind") {
  const auto ps = prompts(6);
  auto ctx = make_context(8, 24);  // 24 blocks for up to 8 sequences: preemption is certain
  Scheduler s(*ctx, engine().tok);
  Collector col;
  std::vector<uint64_t> ids;
  int done_calls = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    GenerationParams p = greedy(40);
    p.n = i % 2 == 0 ? 3 : 1;
    auto r = col.make(ps[i], p);
    r.on_done = [&](const Usage&) { ++done_calls; };
    auto id = s.submit(std::move(r));
    REQUIRE_MESSAGE(id.ok(), (id.ok() ? std::string() : id.error().message));
    ids.push_back(*id);
  }
  for (int i = 0; i < 6; ++i) REQUIRE(s.step().ok());
  s.cancel(ids[2]);  // a 3-choice request, forked or not yet
  s.cancel(ids[5]);
  REQUIRE(s.run_until_idle().ok());
  CHECK(done_calls == 6);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int32_t c = 0; c < (i % 2 == 0 ? 3 : 1); ++c) {
      const Outcome& o = col.at(ids[i], c);
      CHECK_MESSAGE(o.finished_events == 1, "request ", i, " choice ", c);
      if (i != 2 && i != 5) CHECK(o.reason != FinishReason::kCancelled);
    }
  // Greedy choices of one request are identical, preempted or not.
  CHECK(col.at(ids[0], 0).tokens == col.at(ids[0], 1).tokens);
  CHECK(col.at(ids[4], 0).tokens == col.at(ids[4], 2).tokens);
  CHECK(s.stats().preemptions > 0);
  CHECK(ctx->kv().pool().n_referenced() == 0);
}
