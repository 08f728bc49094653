// The batching policy of the scheduler, step by step (SchedulerOptions::on_step): a prompt that
// arrives while others decode joins the very next step beside them, a step's prompt share is
// bounded while sequences decode (so they keep their pace and a burst is spread out), a step with
// nothing decoding takes the whole budget, waiting prompts are never starved by decoding rows,
// and none of it changes what a greedy request generates.
#include <doctest/doctest.h>

#include <map>

#include "formats/weight_source.h"
#include "src/runtime/scheduler.h"
#include "tests/test_models.h"
#include "tests/testdata.h"

using namespace kite;
using namespace kite::test;

namespace {

const LoadedModel& model() { return load_model("models/llama-target"); }

std::unique_ptr<Context> make_context(int32_t n_seqs) {
  ContextOptions o;
  o.n_ctx = 512;
  o.n_seqs = n_seqs;
  o.n_threads = 2;
  auto c = Context::create(model().model, o);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.error().message));
  return std::move(*c);
}

// Prompts cut from the held-out text: `n` of `chars` characters each, from the `first`-th cut on.
std::vector<std::vector<int32_t>> prompts(size_t n, size_t chars, size_t first = 0) {
  static const std::string text = read_file(testdata("heldout.txt"));
  std::vector<std::vector<int32_t>> out;
  for (size_t i = first; i < first + n; ++i)
    out.push_back(model().tok->encode(text.substr((i * 1543) % (text.size() - 4000), chars)));
  return out;
}

GenerationParams greedy(int32_t max_tokens) {
  GenerationParams p;
  p.sampling.temperature = 0.f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Tokens per request id, and the step (1-based) at which each got its first token.
struct Recorder {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, int64_t> first_step;
  std::vector<StepInfo> steps;
  Request make(std::vector<int32_t> prompt, int32_t max_tokens) {
    Request r;
    r.prompt = std::move(prompt);
    r.params = greedy(max_tokens);
    r.on_event = [this](const StreamEvent& e) {
      if (e.token < 0) return;
      auto& t = tokens[e.request];
      if (t.empty()) first_step[e.request] = static_cast<int64_t>(steps.size()) + 1;  // on_step comes after
      t.push_back(e.token);
    };
    return r;
  }
  SchedulerOptions options(SchedulerOptions so) {
    so.on_step = [this](const StepInfo& i) { steps.push_back(i); };
    return so;
  }
};

// Each prompt run alone: the reference every batched run must reproduce.
std::vector<std::vector<int32_t>> alone(const std::vector<std::vector<int32_t>>& ps, int32_t max_tokens) {
  auto ctx = make_context(1);
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : ps) {
    Scheduler s(*ctx, model().tok, {});
    Recorder rec;
    auto id = s.submit(rec.make(p, max_tokens));
    REQUIRE(id.ok());
    REQUIRE(s.run_until_idle().ok());
    out.push_back(rec.tokens[*id]);
  }
  return out;
}

}  // namespace

TEST_CASE(
    "scheduler policy: a prompt arriving while 8 sequences decode joins the next step and is prefilled in "
    "ceil(len / max_prefill_tokens) steps beside every decoding row") {
  auto ps = prompts(8, 160);  // together well within one step's budget
  ps.push_back(prompts(1, 400, 8)[0]);
  const int32_t kMax = 40;
  const size_t late_len = ps[8].size();
  REQUIRE(late_len > 64);  // several chunks
  size_t first8 = 0;
  for (size_t i = 0; i < 8; ++i) first8 += ps[i].size();
  REQUIRE(first8 <= 512);
  const auto ref = alone(ps, kMax);

  auto ctx = make_context(9);
  Recorder rec;
  SchedulerOptions so;
  so.max_prefill_tokens = 32;
  Scheduler s(*ctx, model().tok, rec.options(so));
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < 8; ++i) ids.push_back(*s.submit(rec.make(ps[i], kMax)));
  // Nothing decodes yet: the first step takes the eight prompts whole (the full budget).
  REQUIRE(s.step().ok());
  REQUIRE(rec.steps.size() == 1);
  CHECK(rec.steps[0].decode_rows == 0);
  CHECK(rec.steps[0].admitted == 8);
  CHECK(rec.steps[0].prompt_seqs == 8);
  CHECK(rec.steps[0].first_tokens == 8);
  for (int i = 0; i < 3; ++i) REQUIRE(s.step().ok());  // eight sequences decode
  CHECK(rec.steps.back().decode_rows == 8);
  CHECK(rec.steps.back().prompt_tokens == 0);

  const size_t before = rec.steps.size();
  ids.push_back(*s.submit(rec.make(ps[8], kMax)));
  while (rec.tokens[ids[8]].empty()) REQUIRE(s.step().ok());
  const size_t steps = rec.steps.size() - before;
  CHECK(steps == (late_len + 31) / 32);
  CHECK(rec.first_step[ids[8]] == static_cast<int64_t>(rec.steps.size()));
  const StepInfo& joined = rec.steps[before];
  CHECK(joined.admitted == 1);        // admitted at the very next step ...
  CHECK(joined.prompt_tokens == 32);  // ... with a first chunk of its prompt ...
  for (size_t k = before; k < rec.steps.size(); ++k) {
    CHECK(rec.steps[k].decode_rows >= 8);  // ... beside all eight decoding rows, every step
    CHECK(rec.steps[k].prompt_tokens <= 32);
  }
  REQUIRE(s.run_until_idle().ok());
  for (size_t i = 0; i < ids.size(); ++i) CHECK_MESSAGE(rec.tokens[ids[i]] == ref[i], "request ", i);
  CHECK(ctx->kv().pool().n_referenced() == 0);
}

TEST_CASE(
    "scheduler policy: a burst is spread over steps, prompts are never starved by decoding rows, and the "
    "greedy output equals each request alone") {
  const auto ps = prompts(12, 80);
  const int32_t kMax = 64;  // the first sequences still decode when the last prompts are computed
  const auto ref = alone(ps, kMax);
  int64_t total_prompt = 0;
  for (const auto& p : ps) total_prompt += static_cast<int64_t>(p.size());

  // A budget no larger than the rows that may decode: without the prompt share reserved in every
  // step, the last prompts got what up to 11 decoding rows left of it, one token a step.
  auto ctx = make_context(12);
  Recorder rec;
  SchedulerOptions so;
  so.max_batch_tokens = 12;
  so.max_prefill_tokens = 8;
  Scheduler s(*ctx, model().tok, rec.options(so));
  std::vector<uint64_t> ids;
  for (const auto& p : ps) ids.push_back(*s.submit(rec.make(p, kMax)));
  REQUIRE(s.run_until_idle().ok());
  for (size_t i = 0; i < ids.size(); ++i) CHECK_MESSAGE(rec.tokens[ids[i]] == ref[i], "request ", i);

  REQUIRE(!rec.steps.empty());
  CHECK(rec.steps[0].decode_rows == 0);
  CHECK(rec.steps[0].prompt_tokens == 12);  // nothing decodes: the whole budget
  int64_t prompt_seen = 0;
  for (size_t k = 0; k < rec.steps.size(); ++k) {
    const StepInfo& st = rec.steps[k];
    INFO("step ", st.step);
    prompt_seen += st.prompt_tokens;
    CHECK(st.decode_rows + st.prompt_tokens <= 12);
    if (st.decode_rows > 0) CHECK(st.prompt_tokens <= 8);
    // Admitted prompt tokens waited before this step: it computes some of them.
    if (k > 0 && rec.steps[k - 1].waiting_prompt_tokens > 0)
      CHECK(st.prompt_tokens >= std::min(3, rec.steps[k - 1].waiting_prompt_tokens));  // 12 / 4
  }
  // Every prompt token once (distinct prompts: no prefix-cache hits, no preemption).
  CHECK(prompt_seen + 12 >= total_prompt);  // a one-token remainder is computed as a decode row
  CHECK(prompt_seen <= total_prompt);
  CHECK(ctx->kv().pool().n_referenced() == 0);
}
