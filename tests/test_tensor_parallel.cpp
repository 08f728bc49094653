// Tensor parallelism on CPU ranks (threads of this process): the host communicator, and models
// split over two ranks against one rank — the same sharding and all_reduce placement a GPU group
// runs (docs/ARCHITECTURE.md, "Multi-GPU").
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "src/core/comm.h"
#include "src/runtime/context.h"
#include "tests/bf16_mode.h"
#include "tests/gpu_checks.h"
#include "tests/test_models.h"

namespace kite {
namespace {

using test::argmax_of;
using test::LoadedModel;
using test::load_model;

Result<std::unique_ptr<Context>> make_ctx(const LoadedModel& l, int32_t ranks, int n_seqs = 1) {
  ContextOptions o;
  o.n_ctx = 256;
  o.n_seqs = n_seqs;
  o.n_threads = 2;
  o.tensor_parallel = ranks;
  return Context::create(l.model, o);
}

double nmse(std::span<const float> got, std::span<const float> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return num / den;
}

TEST_CASE("tensor parallel: the host communicator sums in rank order on every rank, and an abort frees the waiting") {
  constexpr int kWorld = 3;
  HostCommunicator comm(kWorld);
  std::vector<std::vector<float>> data(kWorld);
  for (int r = 0; r < kWorld; ++r)
    for (int i = 0; i < 1000; ++i) data[static_cast<size_t>(r)].push_back(0.1f * static_cast<float>(r + 1) + 1e-3f * i);
  std::vector<float> want(1000);
  for (int i = 0; i < 1000; ++i) want[static_cast<size_t>(i)] = (data[0][i] + data[1][i]) + data[2][i];
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int r = 0; r < kWorld; ++r)
    ts.emplace_back([&, r] {
      for (int round = 0; round < 3; ++round) {  // (the group is reused call after call)
        std::vector<float> d = data[static_cast<size_t>(r)];
        if (comm.all_reduce_sum(r, d.data(), d.size()).ok() && d == want) ++ok;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(ok == 3 * kWorld);

  // Rank 2 never comes: its abort releases ranks 0 and 1 with its reason.
  std::vector<std::string> errors(2);
  ts.clear();
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      std::vector<float> d(10, 1.f);
      Status st = comm.all_reduce_sum(r, d.data(), d.size());
      errors[static_cast<size_t>(r)] = st.ok() ? "" : st.error().message;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  comm.abort("rank 2 failed: out of memory");
  for (auto& t : ts) t.join();
  for (const std::string& e : errors) CHECK(e.find("rank 2 failed: out of memory") != std::string::npos);
  comm.reset();

  // Ranks that disagree on the size fail, all of them, instead of reading past a buffer.
  ts.clear();
  std::atomic<int> failed{0};
  for (int r = 0; r < kWorld; ++r)
    ts.emplace_back([&, r] {
      std::vector<float> d(static_cast<size_t>(r == 1 ? 5 : 10), 1.f);
      if (!comm.all_reduce_sum(r, d.data(), d.size()).ok()) ++failed;
    });
  for (auto& t : ts) t.join();
  CHECK(failed == kWorld);
}

TEST_CASE("tensor parallel: two CPU ranks give one rank's logits and greedy text") {
  // A K-quant GGUF file (row-parallel slices of whole 256-element blocks), qwen2 (Q/K/V biases
  // split with their heads) and qwen3 (per-head Q/K norms) from their Hugging Face folders.
  for (const std::string name : {"gguf/llama-target-Q4_K_M.gguf", "models/qwen2-tiny", "models/qwen3-tiny"}) {
    INFO(name);
    const LoadedModel& l = load_model(name);
    auto one = make_ctx(l, 1), two = make_ctx(l, 2);
    REQUIRE_MESSAGE(two.ok(), (two.ok() ? std::string() : two.error().message));
    REQUIRE(one.ok());
    CHECK((*two)->n_backends() == 2);
    EncodeOptions eo;
    const std::vector<int32_t> prompt = l.tok->encode("Once upon a time, the king of the land said", eo);
    REQUIRE((*one)->eval(prompt, 0, true).ok());
    REQUIRE((*two)->eval(prompt, 0, true).ok());
    // The ranks' partial sums add in another order than one rank's dot products: close, not
    // equal. With int8 activations (the K-quant file) a last-bit difference can move a value
    // across a rounding step of the next layer's quantized activations, so its bound is wider;
    // a wrong slice or a missing sum is off by ~1.
    // The same holds for activations rounded to bf16 (qwen3-tiny's BF16 weights on a CPU with
    // AVX512-BF16, tests/bf16_mode.h), at a finer step: measured 1.0e-6 / 1.3e-6 there, 1e-10
    // with f32 activations.
    const bool quantized = name.find("Q4_K_M") != std::string::npos;
    const bool rounded = name == "models/qwen3-tiny" && kite::test::bf16_activations_rounded();
    const double float_bound = rounded ? 1e-5 : 1e-6;
    double worst = 0;
    for (size_t i = 0; i < prompt.size(); ++i) worst = std::max(worst, nmse((*two)->logits(i), (*one)->logits(i)));
    CHECK(worst < (quantized ? 1e-4 : float_bound));
    CHECK(worst > 0);  // (two ranks really ran: bit-equal logits would mean one did all the work)
    // Greedy decoding, both fed one rank's tokens: close logits at every step, and the same token
    // wherever one rank's best two are not a near-tie (the ranks' summation order moves the
    // quantized file's logits by ~0.02, and its text has closer ties than that).
    int32_t t = argmax_of((*one)->logits(prompt.size() - 1));
    int ties = 0;
    for (int step = 0; step < 24; ++step) {
      INFO("step ", step);
      const BatchToken a{t, 0, true};
      REQUIRE((*one)->decode(std::span<const BatchToken>(&a, 1)).ok());
      REQUIRE((*two)->decode(std::span<const BatchToken>(&a, 1)).ok());
      const auto l1 = (*one)->logits(0), l2 = (*two)->logits(0);
      // (The quantized file's bound is wider than the prompt's: each step also reads the KV
      // entries the ranks wrote apart, and the differences grow to ~1e-4 over 24 steps.)
      CHECK(nmse(l2, l1) < (quantized ? 1e-3 : float_bound));
      t = argmax_of(l1);
      float second = -INFINITY;
      for (size_t i = 0; i < l1.size(); ++i)
        if (static_cast<int32_t>(i) != t) second = std::max(second, l1[i]);
      if (l1[static_cast<size_t>(t)] - second < 0.05f) ++ties;
      else CHECK(argmax_of(l2) == t);
    }
    CHECK(ties <= 4);  // (the check above must really run)
  }
}

TEST_CASE("tensor parallel: batched sequences, a shared prefix and copy-on-write on every rank") {
  const LoadedModel& l = load_model("gguf/llama-target-Q4_K_M.gguf");
  auto one = make_ctx(l, 1, 3), two = make_ctx(l, 2, 3);
  REQUIRE(one.ok());
  REQUIRE(two.ok());
  EncodeOptions eo;
  const std::vector<int32_t> p0 = l.tok->encode("The little dog ran to the", eo);
  for (auto* c : {one->get(), two->get()}) {
    REQUIRE(c->eval(p0, 0).ok());
    REQUIRE(c->kv().fork(0, 1).ok());  // sequence 1 shares sequence 0's blocks
    REQUIRE(c->eval(l.tok->encode("Hello there", eo), 2).ok());
  }
  std::vector<int32_t> tok = {argmax_of((*one)->logits(0)), argmax_of((*one)->logits(0)), 7};
  for (int step = 0; step < 12; ++step) {
    // Sequences 0 and 1 write into their shared last block: each gets its own copy, on every rank.
    const std::vector<BatchToken> batch = {{tok[0], 0, true}, {tok[1] + (step == 0 ? 1 : 0), 1, true}, {tok[2], 2, true}};
    REQUIRE((*one)->decode(batch).ok());
    REQUIRE((*two)->decode(batch).ok());
    for (size_t i = 0; i < 3; ++i) {
      CHECK(nmse((*two)->logits(i), (*one)->logits(i)) < 1e-4);  // (int8 activations: see above)
      tok[i] = argmax_of((*one)->logits(i));
      // The same greedy token, or a near tie in one rank's logits.
      const int32_t t2 = argmax_of((*two)->logits(i));
      CHECK(std::abs((*one)->logits(i)[static_cast<size_t>(tok[i])] - (*one)->logits(i)[static_cast<size_t>(t2)]) < 0.05f);
    }
  }
  CHECK((*two)->kv().stats().cow_copies > 0);
}

TEST_CASE("tensor parallel: a sequence's saved KV (every rank's heads) restores to the same next logits") {
  const LoadedModel& l = load_model("gguf/llama-target-Q4_K_M.gguf");
  auto a = make_ctx(l, 2), b = make_ctx(l, 2);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  EncodeOptions eo;
  const std::vector<int32_t> prompt = l.tok->encode("The queen sat upon her throne and", eo);
  REQUIRE((*a)->eval(prompt, 0).ok());
  KvCache& kv = (*a)->kv();
  CHECK(kv.n_ranks() == 2);
  std::vector<uint8_t> bytes(kv.seq_state_bytes(0));
  CHECK(bytes.size() == 2 * 2 * 4 * kv.row_bytes() * prompt.size());  // K and V, 2 ranks, 4 layers
  REQUIRE(kv.read_seq(0, bytes).ok());
  REQUIRE((*b)->kv().write_seq(0, prompt, bytes).ok());
  const BatchToken next{argmax_of((*a)->logits(0)), 0, true};
  REQUIRE((*a)->decode(std::span<const BatchToken>(&next, 1)).ok());
  REQUIRE((*b)->decode(std::span<const BatchToken>(&next, 1)).ok());
  const auto la = (*a)->logits(0), lb = (*b)->logits(0);
  CHECK(std::equal(la.begin(), la.end(), lb.begin()));
}

TEST_CASE("tensor parallel: models that do not split, --gpu-layers, devices without a group: clear errors") {
  auto message = [](const Result<std::unique_ptr<Context>>& r) { return r.ok() ? std::string() : r.error().message; };
  // llama-draft has one KV head; the target's 8 heads do not split 3 ways.
  const std::string draft = message(make_ctx(load_model("gguf/llama-draft-Q4_K_M.gguf"), 2));
  CHECK(draft.find("KV heads (1) is not divisible by 2") != std::string::npos);
  const LoadedModel& l = load_model("gguf/llama-target-Q4_K_M.gguf");
  CHECK(message(make_ctx(l, 3)).find("attention heads (8) is not divisible by 3") != std::string::npos);
  CHECK(message(make_ctx(l, 0)).find("tensor_parallel must be 1 or more") != std::string::npos);
  ContextOptions o;
  o.tensor_parallel = 2;
  o.gpu_layers = 1;
  auto split = Context::create(l.model, o);
  CHECK(message(split).find("cannot be combined with --gpu-layers") != std::string::npos);
  o.gpu_layers = -1;
  o.device = "vulkan";
  auto vk = Context::create(l.model, o);
  CHECK(message(vk).find("tensor parallelism is not available on 'vulkan'") != std::string::npos);
}

}  // namespace
}  // namespace kite
