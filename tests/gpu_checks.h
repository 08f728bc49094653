// What every GPU backend is held to against the CPU (test_cuda.cpp, test_vulkan.cpp): greedy
// output of the F16 test models equal to the CPU's except at near-ties, GGUF perplexity within
// 0.5% of llama.cpp's, a sequence's greedy tokens independent of what shares its batch, and
// rows reduced (top k, draws) on the device sampling to the tokens of whole rows.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/runtime/context.h"
#include "src/runtime/perplexity.h"
#include "src/runtime/scheduler.h"
#include "tests/gemma_model.h"
#include "tests/moe_model.h"
#include "tests/process.h"
#include "tests/test_models.h"
#include "tests/testdata.h"

namespace kite::test {

inline std::unique_ptr<Context> make_device_ctx(const LoadedModel& l, const std::string& device, int64_t n_ctx,
                                                int n_seqs = 1, DType kv_type = DType::F16) {
  ContextOptions opts;
  opts.n_ctx = n_ctx;
  opts.n_seqs = n_seqs;
  opts.device = device;
  opts.kv_type = kv_type;
  auto ctx = Context::create(l.model, opts);
  REQUIRE_MESSAGE(ctx.ok(), device, ": ", (ctx.ok() ? std::string() : ctx.error().message));
  return std::move(*ctx);
}

inline int32_t argmax_of(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Greedy decoding of `steps` tokens on the CPU and on `device` in lockstep: the prefill logits
// close as a whole, the tokens equal until a divergence, which must be at a near-tie.
inline void check_greedy_matches_cpu(const std::string& device, const LoadedModel& l, const std::string& name,
                                     int steps) {
  auto cpu = make_device_ctx(l, "cpu", 256);
  auto gpu = make_device_ctx(l, device, 256);
  EncodeOptions eo;
  std::vector<int32_t> prompt = l.tok->encode("Once upon a time, the citizens", eo);
  REQUIRE(!prompt.empty());
  REQUIRE(cpu->eval(prompt).ok());
  auto st = gpu->eval(prompt);
  REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
  int same = 0;
  for (int step = 0; step < steps; ++step) {
    const auto lc = cpu->logits(0), lg = gpu->logits(0);
    if (step == 0) {  // prefill logits close as a whole
      double num = 0, den = 0;
      for (size_t i = 0; i < lc.size(); ++i) num += (lc[i] - lg[i]) * (lc[i] - lg[i]), den += lc[i] * lc[i];
      INFO(name, " prefill logits nmse ", num / den);
      CHECK(num / den < 1e-4);
    }
    const int32_t tc = argmax_of(lc), tg = argmax_of(lg);
    if (tc != tg) {
      const float gap = lc[static_cast<size_t>(tc)] - lc[static_cast<size_t>(tg)];
      MESSAGE(name, ": diverged at step ", step, " (cpu ", tc, ", ", device, " ", tg, ", cpu logit gap ", gap, ")");
      CHECK_MESSAGE(gap < 0.05f * std::max(1.f, std::fabs(lc[static_cast<size_t>(tc)])), name, " not a near-tie");
      break;
    }
    ++same;
    if (l.tok->is_eog(tc)) break;
    const BatchToken bt{tc, 0, true};
    REQUIRE(cpu->decode(std::span<const BatchToken>(&bt, 1)).ok());
    auto s2 = gpu->decode(std::span<const BatchToken>(&bt, 1));
    REQUIRE_MESSAGE(s2.ok(), (s2.ok() ? std::string() : s2.error().message));
  }
  MESSAGE(name, ": ", same, " greedy tokens equal on cpu and ", device);
  CHECK(same >= std::min(8, steps));
}
inline void check_greedy_matches_cpu(const std::string& device, const std::vector<std::string>& models, int steps) {
  for (const std::string& name : models) check_greedy_matches_cpu(device, load_model(name), name, steps);
}

// Where check_perplexity finds its files and their llama.cpp perplexities (peer-reference.json's
// shape: file -> {ppl_ctx256, ...}): by default the test data's GGUF files.
struct PplReference {
  std::string json = testdata("gguf/peer-reference.json");
  std::string dir = testdata("gguf");
};

// Perplexity of the model at `path` on `device` over the first `max_tokens` tokens of the
// held-out text (0: all of it), against the CPU's over the same span, or over all of it against
// `llama_cpp_ppl` (the file's ppl_ctx256): within `tolerance`.
inline void check_perplexity_of(const std::string& device, const std::string& path, size_t max_tokens, double tolerance,
                                double llama_cpp_ppl = 0) {
  const std::string file = std::filesystem::path(path).filename().string();
  const LoadedModel l = load_model_at(path, file);
  EncodeOptions eo;
  eo.add_special = false;
  std::vector<TokenId> tokens = l.tok->encode(read_file(testdata("heldout.txt")), eo);
  tokens.insert(tokens.begin(), l.tok->bos());
  if (max_tokens > 0 && tokens.size() > max_tokens) tokens.resize(max_tokens);
  auto ctx = make_device_ctx(l, device, 256);
  auto r = perplexity_llama_cpp(*ctx, tokens, l.tok->bos(), 256);
  REQUIRE_MESSAGE(r.ok(), file, ": ", (r.ok() ? std::string() : r.error().message));
  double want = llama_cpp_ppl;
  if (max_tokens > 0) {  // the same span on the CPU (itself within 0.5% of llama.cpp: test_perplexity)
    auto cpu = make_device_ctx(l, "cpu", 256);
    auto rc = perplexity_llama_cpp(*cpu, tokens, l.tok->bos(), 256);
    REQUIRE_MESSAGE(rc.ok(), file, ": ", (rc.ok() ? std::string() : rc.error().message));
    want = rc->ppl;
  }
  REQUIRE_MESSAGE(want > 0, file, ": no reference perplexity");
  MESSAGE(file, " on ", device, ": ", r->ppl, " (reference ", want, ", ", 100 * (r->ppl / want - 1), "%)");
  CHECK_MESSAGE(std::fabs(r->ppl / want - 1) < tolerance, file);
}

// check_perplexity_of each GGUF file of the reference (all when `files` is empty), its
// ppl_ctx256 llama.cpp's.
inline void check_perplexity(const std::string& device, const std::vector<std::string>& files, size_t max_tokens,
                             double tolerance = 0.005, const PplReference& where = {}) {
  const auto peer = nlohmann::json::parse(read_file(where.json));
  for (const auto& [file, ref] : peer.items()) {
    if (!files.empty() && std::find(files.begin(), files.end(), file) == files.end()) continue;
    check_perplexity_of(device, where.dir + "/" + file, max_tokens, tolerance, ref["ppl_ctx256"].get<double>());
  }
}

// Two contexts on one model upload its weights once: the second uploads nothing and computes the
// same logits, the copy goes with the last context, and a later context uploads it again.
// `mirrored_bytes` reads the device's weight-copy total.
inline void check_shared_weights(const std::string& device, size_t (*mirrored_bytes)()) {
  const LoadedModel& l = load_model("gguf/llama-draft-Q8_0.gguf");
  const size_t before = mirrored_bytes();
  EncodeOptions eo;
  const std::vector<int32_t> prompt = l.tok->encode("The king said", eo);
  std::vector<float> first;
  size_t one = 0;
  {
    auto a = make_device_ctx(l, device, 128);
    REQUIRE(a->eval(prompt).ok());
    first.assign(a->logits(0).begin(), a->logits(0).end());
    one = mirrored_bytes() - before;
    CHECK(one > 1'000'000);  // the 2.8 MB model's weights, uploaded once
    auto b = make_device_ctx(l, device, 128);
    REQUIRE(b->eval(prompt).ok());
    CHECK(mirrored_bytes() - before == one);  // the second context uploaded nothing
    const auto second = b->logits(0);
    CHECK(std::equal(first.begin(), first.end(), second.begin()));
  }
  CHECK(mirrored_bytes() == before);  // released with the last context using them
  auto c = make_device_ctx(l, device, 128);
  REQUIRE(c->eval(prompt).ok());
  CHECK(mirrored_bytes() - before == one);
  const auto again = c->logits(0);
  CHECK(std::equal(first.begin(), first.end(), again.begin()));
}

// The last layer on `device`, the rest on the CPU (--gpu-layers 1): the CPU's logits.
inline void check_split_placement(const std::string& device) {
  const LoadedModel& l = load_model("gguf/llama-draft-f16.gguf");
  EncodeOptions eo;
  const std::vector<int32_t> prompt = l.tok->encode("Once upon a time", eo);
  auto cpu = make_device_ctx(l, "cpu", 128);
  REQUIRE(cpu->eval(prompt).ok());
  const auto ref = cpu->logits(0);
  ContextOptions opts;
  opts.n_ctx = 128;
  opts.device = device;
  opts.gpu_layers = 1;
  auto split = Context::create(l.model, opts);
  REQUIRE_MESSAGE(split.ok(), (split.ok() ? std::string() : split.error().message));
  REQUIRE((*split)->eval(prompt).ok());
  const auto got = (*split)->logits(0);
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) num += (ref[i] - got[i]) * (ref[i] - got[i]), den += ref[i] * ref[i];
  CHECK(num / den < 1e-5);
  CHECK(argmax_of(ref) == argmax_of(got));
}

// One sequence decoded alone and beside another: the same greedy tokens.
inline void check_batch_invariance(const std::string& device, const LoadedModel& l, int steps) {
  auto alone = make_device_ctx(l, device, 256, 3);
  auto mixed = make_device_ctx(l, device, 256, 3);
  EncodeOptions eo;
  const std::vector<int32_t> p0 = l.tok->encode("The king said", eo), p1 = l.tok->encode("Hello there, my friend", eo);
  REQUIRE(alone->eval(p0, 0).ok());
  REQUIRE(mixed->eval(p0, 0).ok());
  REQUIRE(mixed->eval(p1, 1).ok());
  int32_t t0 = argmax_of(alone->logits(0));
  int32_t t1 = argmax_of(mixed->logits(0));
  for (int step = 0; step < steps; ++step) {
    const BatchToken one{t0, 0, true};
    REQUIRE(alone->decode(std::span<const BatchToken>(&one, 1)).ok());
    const BatchToken two[2] = {{t0, 0, true}, {t1, 1, true}};
    REQUIRE(mixed->decode(std::span<const BatchToken>(two, 2)).ok());
    const auto la = alone->logits(0), lm = mixed->logits(0);
    REQUIRE(la.size() == lm.size());
    // Same token either way; the logits may differ in the last bits (mat-vec vs batched columns).
    CHECK(argmax_of(la) == argmax_of(lm));
    t0 = argmax_of(la);
    t1 = argmax_of(mixed->logits(1));
  }
}
inline void check_batch_invariance(const std::string& device, const std::string& model, int steps) {
  check_batch_invariance(device, load_model(model), steps);
}

// The MoE test model (tests/moe_model.h's qwen3moe) on `device`, F16 and as kite's Q4_K_M of it,
// its experts wherever the context puts them (on the CPU where the device has no kernels for
// their type, which the CLI says): greedy tokens as the CPU's, a sequence's tokens independent
// of its batch, and perplexity over the first `max_tokens` tokens as the CPU's (0: the F16 one's
// over the whole text, against llama.cpp's).
inline void check_moe(const std::string& device, size_t max_tokens, double tolerance = 0.005) {
  const std::string f16 = moe_test_file("qwen3moe-tiny.gguf");
  const std::string q4 = (std::filesystem::path(f16).parent_path() / "qwen3moe-tiny-kite-Q4_K_M.gguf").string();
  if (!std::filesystem::exists(q4)) {
    const ProcessResult q = run_kite({"quantize", f16, q4, "Q4_K_M"});
    REQUIRE_MESSAGE(q.exit_code == 0, q.err);
  }
  auto be = create_backend(device);
  REQUIRE(be.ok());
  for (const std::string& path : {f16, q4}) {
    const std::string name = std::filesystem::path(path).stem().string();
    const LoadedModel l = load_model_at(path, name);
    check_greedy_matches_cpu(device, l, name, 24);
    check_batch_invariance(device, l, 8);
    // The CLI says where the experts ran: on the CPU exactly when the device has no kernels for
    // the experts' type.
    const TensorInfo* w = l.model->source().find_tensor("blk.0.ffn_up_exps.weight");
    REQUIRE(w != nullptr);
    Graph g;
    Tensor* probe = g.mul_mat_id(g.input(w->type, {w->ne[0], w->ne[1], w->ne[2]}, "w"),
                                 g.input(DType::F32, {w->ne[0], 1, 1}, "x"), g.input(DType::F32, {3, 1}, "route"), 1);
    const ProcessResult r = run_kite({"run", "-m", path, "--device", device, "-p", "Hello", "-n", "4", "--temp", "0"});
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    const bool on_cpu = r.err.find("the model's experts run on the CPU") != std::string::npos;
    MESSAGE(name, " on ", device, ": experts on the ", std::string(on_cpu ? "CPU" : "device"));
    CHECK(on_cpu == !(*be)->supports(*probe));
    // --cpu-moe: there even where the device runs them, with the same tokens.
    const ProcessResult forced =
        run_kite({"run", "-m", path, "--device", device, "--cpu-moe", "-p", "Hello", "-n", "4", "--temp", "0"});
    CHECK_MESSAGE(forced.exit_code == 0, forced.err);
    CHECK(forced.err.find("the model's experts run on the CPU") != std::string::npos);
    CHECK(forced.out == r.out);
  }
  check_perplexity_of(device, f16, max_tokens, tolerance,
                      nlohmann::json::parse(read_file(moe_reference_path()))["qwen3moe-tiny.gguf"]["ppl_ctx256"]);
  check_perplexity_of(device, q4, 512, tolerance);  // (kite's own Q4_K_M: no llama.cpp number)
}

// The gemma test models (tests/gemma_model.h: sliding-window and global layers, gelu FFN,
// post-norms, gemma2's soft-capping) on `device`: the CPU's greedy tokens, batch invariance past
// the window, llama.cpp's perplexity (max_tokens: the CPU's over that many tokens instead).
inline void check_gemma(const std::string& device, size_t max_tokens, double tolerance = 0.005) {
  for (const char* name : {"gemma3-tiny.gguf", "gemma2-tiny.gguf"}) {
    const std::string path = gemma_test_file(name);
    const LoadedModel l = load_model_at(path, name);
    check_greedy_matches_cpu(device, l, name, 60);
    check_batch_invariance(device, l, 60);
    check_perplexity_of(device, path, max_tokens, tolerance,
                        nlohmann::json::parse(read_file(gemma_reference_path()))[name]["ppl_ctx256"]);
  }
}

// Sampler's draw with every filter off (what Graph::top_k's draw promises), given the uniform.
inline int32_t reference_draw(std::span<const float> x, float t, double u) {
  float m = -INFINITY;
  for (float v : x) m = v > m ? v : m;
  double total = 0;
  for (float v : x) total += v > -INFINITY ? std::exp((v - m) * (1.f / t)) : 0.0;
  double acc = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(x[i] > -INFINITY)) continue;
    acc += std::exp((x[i] - m) * (1.f / t));
    if (u * total < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(x.size()) - 1;
}

// A step that brings back each output's top 64 logits (Op::kTopK, run where the logits are)
// returns exactly the top 64 of the logits a whole-row step of the same batch brings back (the
// same kernels on the same device), with the row's log-sum-exp; over prefill and decode steps.
inline void check_top_k_outputs(const std::string& device) {
  const LoadedModel& l = load_model("gguf/llama-draft-Q4_K_M.gguf");
  auto top = make_device_ctx(l, device, 64, 3), whole = make_device_ctx(l, device, 64, 3);
  REQUIRE(top->supports_top_k());
  const int32_t n_vocab = l.model->hparams().n_vocab;
  std::vector<BatchToken> batch;
  for (int32_t s = 0; s < 3; ++s)
    for (int32_t i = 0; i < 5 + s; ++i) batch.push_back({(i * 37 + s * 11 + 5) % n_vocab, s, i + 1 == 5 + s});
  // Each output also draws a token at temperature 0.9 (every backend draws).
  REQUIRE(top->supports_top_k(true));
  std::vector<RowDraw> draw(3);
  for (int step = 0; step < 5; ++step) {
    for (size_t o = 0; o < draw.size(); ++o) draw[o] = {0.9f, 0.1 + 0.35 * static_cast<double>(o) + 0.02 * step};
    OutputTopK ask;
    ask.k = 64, ask.log_sum_exp = true;
    ask.draws = draw;
    const int32_t whole_rows[] = {0, 2};  // odd steps: these outputs' whole rows come back too
    if (step % 2 == 1) ask.whole_rows = whole_rows;
    REQUIRE(top->decode(batch, OutputKind::kLogits, ask).ok());
    REQUIRE(whole->decode(batch).ok());
    REQUIRE(top->n_outputs() == whole->n_outputs());
    batch.clear();
    if (step % 2 == 0) {  // every output's row in one download (odd steps: one by one, below)
      std::vector<size_t> outputs = {top->n_outputs() - 1};
      for (size_t o = 0; o < top->n_outputs(); ++o) outputs.push_back(o);  // (one twice)
      outputs.push_back(top->n_outputs());
      CHECK_FALSE(top->fetch_logits(outputs).ok());  // (no such output: nothing fetched)
      outputs.pop_back();
      REQUIRE(top->fetch_logits(outputs).ok());
    }
    for (size_t o = 0; o < whole->n_outputs(); ++o) {
      const std::span<const float> row = whole->logits(o);
      std::vector<int32_t> idx(row.size());
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
      std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      double m = row[idx[0]], z = 0;
      for (float v : row) z += std::exp(v - m);
      const TopLogits t = top->top_logits(o);
      REQUIRE(t.size() == 64);
      INFO(device, " step ", step, " output ", o);
      for (size_t j = 0; j < 64; ++j) {
        CHECK(t.id(j) == idx[j]);
        CHECK(t.logits[j] == row[idx[j]]);
      }
      CHECK(std::abs(t.log_sum_exp - (m + std::log(z))) < 1e-4 * std::max(1.0, std::abs(m)));
      // The chain's own draw from the whole row with the same uniform (a target at a boundary
      // could move with the device's summation order: improbable here).
      CHECK(t.drawn == reference_draw(row, 0.9f, draw[o].u));
      if (t.drawn >= 0) CHECK(t.drawn_logit == row[static_cast<size_t>(t.drawn)]);
      const bool whole_too = step % 2 == 1 && o != 1;
      REQUIRE(top->has_logits(o) == whole_too);
      if (whole_too) CHECK(std::ranges::equal(top->logits(o), row));
      // And any output's whole row, fetched after the step (top-p past the top k).
      auto fetched = top->fetch_logits(o);
      REQUIRE(fetched.ok());
      CHECK(std::ranges::equal(*fetched, row));
      batch.push_back({t.id(0), static_cast<int32_t>(o), true});  // the greedy token goes on
    }
    CHECK_FALSE(top->fetch_logits(top->n_outputs()).ok());  // (no such output)
  }
}

// The scheduler on `device`, requests of every kind together (the OpenAI API's plain
// temperature sampling drawn on the device, top-p fetched where the top 64 fall short, top-k,
// greedy, penalties beside them whole): the tokens of the same run with whole rows sampled on
// the host (the same logits; a draw could differ only for a target at a boundary: improbable).
inline void check_scheduler_rows(const std::string& device) {
  const LoadedModel& l = load_model("gguf/llama-draft-Q4_K_M.gguf");
  auto run = [&](int32_t top_k_outputs, StepInfo* sum) {
    auto ctx = make_device_ctx(l, device, 512, 6);
    SchedulerOptions so;
    so.top_k_outputs = top_k_outputs;
    so.on_step = [sum](const StepInfo& i) {
      sum->top_k = std::max(sum->top_k, i.top_k);
      sum->device_draws += i.device_draws, sum->whole_rows += i.whole_rows, sum->fetched_rows += i.fetched_rows;
    };
    Scheduler s(*ctx, l.tok, so);
    std::vector<std::vector<int32_t>> tokens(6);
    const char* prompts[] = {"The king said", "Once upon a time", "Hello there, my friend", "The river", "In the morning",
                             "She opened the door"};
    for (int i = 0; i < 6; ++i) {
      Request r;
      r.prompt = l.tok->encode(prompts[i], EncodeOptions{});
      r.params.max_tokens = 20;
      r.params.ignore_eos = true;
      SamplerParams& p = r.params.sampling;
      p.seed = 10 + static_cast<uint64_t>(i);
      if (i < 3) p.temperature = 1.f, p.top_k = 0, p.top_p = 1.f, p.min_p = 0.f;  // the OpenAI API's defaults
      if (i == 1) p.n_logprobs = 2;
      if (i == 3) p.top_k = 0, p.top_p = 0.9f, p.min_p = 0.f;  // top-p alone
      if (i == 4) p.temperature = 0.f;
      if (i == 5) p.repeat_penalty = 0.9f;  // (raises logits: whole rows)
      r.on_event = [&tokens, i](const StreamEvent& e) {
        if (e.token >= 0) tokens[static_cast<size_t>(i)].push_back(e.token);
      };
      REQUIRE(s.submit(std::move(r)).ok());
    }
    REQUIRE(s.run_until_idle().ok());
    return tokens;
  };
  StepInfo top, whole;
  const auto a = run(64, &top), b = run(0, &whole);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(device, " request ", i);
    CHECK(a[i].size() == 20);
    CHECK(a[i] == b[i]);
  }
  CHECK(top.top_k == 64);
  CHECK(top.device_draws > 20);  // (3 requests x 19 decode steps)
  CHECK(top.whole_rows > 10);
  CHECK(whole.top_k == 0);
  MESSAGE(device, ": ", top.device_draws, " rows drawn on the device, ", top.whole_rows, " whole beside them, ",
          top.fetched_rows, " fetched after");
}

}  // namespace kite::test
