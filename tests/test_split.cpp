// Layer placement across backends (ContextOptions::gpu_layers, --gpu-layers), proven without a
// GPU: the "device" is a second CPU backend instance, so a split context runs the same kernels
// as the unsplit one and its logits must be bitwise identical, through prefill, decode, batches
// of several sequences, KV rollback, prefix sharing, copy-on-write and the scheduler; and bytes
// cross between backends only at split boundaries, once per boundary and step.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>

#include "src/core/backend.h"
#include "src/model/model.h"
#include "src/runtime/context.h"
#include "src/runtime/scheduler.h"
#include "src/runtime/tokenizer.h"
#include "tests/process.h"
#include "tests/test_models.h"
#include "tests/testdata.h"

using namespace kite;
using namespace kite::test;

namespace {

// gpu_layers as in ContextOptions; `placement` (if set) overrides it. device "cpu": a split
// puts the device part on a second CPU backend instance.
std::unique_ptr<Context> make_ctx(const LoadedModel& l, int32_t gpu_layers, std::function<int(int32_t)> placement = {},
                                  int32_t n_seqs = 3) {
  ContextOptions o;
  o.n_threads = 2;
  o.n_ctx = 256;
  o.n_seqs = n_seqs;
  o.device = "cpu";
  o.gpu_layers = gpu_layers;
  o.placement = std::move(placement);
  auto c = Context::create(l.model, o);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.error().message));
  return std::move(*c);
}

int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

void append(std::vector<float>& all, const Context& c) {
  for (size_t i = 0; i < c.n_outputs(); ++i) {
    auto l = c.logits(i);
    all.insert(all.end(), l.begin(), l.end());
  }
}

// Prefill in chunks (every token's logits), greedy decode, then batches that mix a decode token
// with prompt chunks of two more sequences. Returns every logit computed, in order.
std::vector<float> scenario(Context& c, const Tokenizer& tok) {
  std::vector<float> all;
  const auto a = tok.encode("First Citizen:\nBefore we proceed any further, hear me speak.", {.add_special = true});
  const auto b = tok.encode("Speak, speak. You are all resolved rather to die", {.add_special = true});
  const auto d = tok.encode("Let us kill him", {.add_special = true});
  REQUIRE(c.eval(a, 0, true, 16).ok());
  append(all, c);
  int32_t next = argmax(c.logits(c.n_outputs() - 1));
  for (int i = 0; i < 4; ++i) {
    const BatchToken t{next, 0, true};
    REQUIRE(c.decode(std::span<const BatchToken>(&t, 1)).ok());
    append(all, c);
    next = argmax(c.logits(0));
  }
  std::vector<BatchToken> batch{{next, 0, true}};
  for (size_t i = 0; i < b.size(); ++i) batch.push_back({b[i], 1, i + 1 == b.size() || i == 2});
  for (size_t i = 0; i < d.size(); ++i) batch.push_back({d[i], 2, i + 1 == d.size()});
  REQUIRE(c.decode(batch).ok());
  append(all, c);
  std::vector<BatchToken> step;
  for (int32_t s = 0; s < 3; ++s) step.push_back({argmax(c.logits(static_cast<size_t>(s == 0 ? 0 : s + 1))), s, true});
  REQUIRE(c.decode(step).ok());
  append(all, c);
  return all;
}

bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// The llama-target safetensors folder (4 layers) and qwen3-tiny's llama.cpp GGUF (2 layers).
constexpr const char* kModels[] = {"models/llama-target", "gguf/qwen3-tiny-f16.gguf"};

// Alternating placement: embedding on 0, then layers 1, 0, 1, ..., the head on the other side
// of the last layer: every layer boundary is a split boundary, both directions.
int alternate(int32_t layer) {
  return (layer + 2) % 2;
}

}  // namespace

TEST_CASE("split: logits of a layer split are bitwise the unsplit context's (prefill, decode, batches)") {
  for (const char* rel : kModels) {
    const LoadedModel& l = load_model(rel);
    const int32_t n_layer = static_cast<int32_t>(l.model->hparams().n_layer);
    auto ref_ctx = make_ctx(l, -1);
    const std::vector<float> ref = scenario(*ref_ctx, *l.tok);
    REQUIRE(ref.size() > 100000);
    for (int32_t k : {0, 1, n_layer / 2, n_layer, n_layer + 5}) {
      CAPTURE(rel);
      CAPTURE(k);
      auto c = make_ctx(l, k);
      CHECK(c->n_backends() == (k == 0 ? 1u : 2u));
      CHECK(bitwise_equal(scenario(*c, *l.tok), ref));
    }
    auto alt = make_ctx(l, -1, alternate);
    CAPTURE(rel);
    CHECK(bitwise_equal(scenario(*alt, *l.tok), ref));
  }
}

TEST_CASE("split: bytes cross between backends only at split boundaries, and each layer's KV is on its backend") {
  const LoadedModel& l = load_model("models/llama-target");
  const int32_t n_layer = static_cast<int32_t>(l.model->hparams().n_layer);
  const int64_t n_embd = l.model->hparams().n_embd;
  REQUIRE(n_layer == 4);
  const auto prompt = l.tok->encode("Citizens, hear me.", {.add_special = true});
  struct Case {
    int32_t gpu_layers;
    std::function<int(int32_t)> placement;
    int splits, copies;  // per step
  };
  const Case cases[] = {
      {0, {}, 1, 0},                              // all on the CPU
      {-1, {}, 1, 0},                             // all on the device
      {1, {}, 2, 1},                              // embd + layers 0..2 | layer 3 + head
      {2, {}, 2, 1},                              // embd + layers 0..1 | layers 2..3 + head
      {n_layer, {}, 2, 1},                        // embd | every layer + head
      {-1, alternate, n_layer + 2, n_layer + 1},  // every boundary
  };
  for (const Case& cs : cases) {
    CAPTURE(cs.gpu_layers);
    CAPTURE(cs.splits);
    auto c = make_ctx(l, cs.gpu_layers, cs.placement);
    REQUIRE(c->eval(prompt, 0).ok());  // one step
    CHECK(c->last_splits() == cs.splits);
    CHECK(c->last_copies() == cs.copies);
    CHECK(c->split_stats().copies == cs.copies);
    // What crosses is the residual stream of the step's tokens, n_embd floats each.
    CHECK(c->split_stats().copy_bytes == cs.copies * n_embd * static_cast<int64_t>(prompt.size()) * 4);
    for (int i = 0; i < 3; ++i) {
      const BatchToken t{5, 0, true};
      REQUIRE(c->decode(std::span<const BatchToken>(&t, 1)).ok());
    }
    CHECK(c->split_stats().runs == 4);
    CHECK(c->split_stats().copies == 4 * cs.copies);
    CHECK(c->split_stats().copy_bytes == cs.copies * n_embd * static_cast<int64_t>(prompt.size() + 3) * 4);
    for (int32_t il = 0; il < n_layer; ++il) {
      const Backend& want = c->backend(static_cast<size_t>(c->placement(il)));
      CHECK(&c->kv().tensors().k[static_cast<size_t>(il)]->buffer->backend() == &want);
      CHECK(&c->kv().tensors().v[static_cast<size_t>(il)]->buffer->backend() == &want);
    }
    if (cs.gpu_layers > 0) {  // the last gpu_layers layers and the head on the device
      CHECK(c->placement(-1) == 0);
      CHECK(c->placement(n_layer - cs.gpu_layers - 1) == 0);
      CHECK(c->placement(n_layer - cs.gpu_layers) == 1);
      CHECK(c->placement(n_layer) == 1);
    }
  }
}

TEST_CASE("split: KV rollback, prefix sharing, copy-on-write and scheduler generation through a split context") {
  const LoadedModel& l = load_model("models/llama-target");
  auto ref = make_ctx(l, -1);
  auto split = make_ctx(l, -1, alternate);  // KV of alternate layers on the two backends
  auto prompt = l.tok->encode(
      "MENENIUS:\nEither you must confess yourselves wondrous malicious, or be accused of folly. "
      "I shall tell you a pretty tale.",
      {.add_special = true});
  if (prompt.size() % 16 == 0) prompt.pop_back();  // end inside a block: the fork shares a partial block
  REQUIRE(prompt.size() > 34);
  std::vector<float> got[2];
  int i = 0;
  for (Context* c : {ref.get(), split.get()}) {
    std::vector<float>& out = got[i++];
    REQUIRE(c->eval(prompt, 0).ok());
    append(out, *c);
    // Rollback: drop the last 12 positions and compute them again.
    c->kv().truncate(0, static_cast<int64_t>(prompt.size()) - 12);
    REQUIRE(c->eval(std::span<const int32_t>(prompt).subspan(prompt.size() - 12), 0, true).ok());
    append(out, *c);
    // Prefix sharing: sequence 1 reuses the full blocks of sequence 0's prompt.
    const int64_t reused = c->kv().match_prefix(1, prompt);
    CHECK(reused == static_cast<int64_t>((prompt.size() - 1) / 16 * 16));
    REQUIRE(c->eval(std::span<const int32_t>(prompt).subspan(static_cast<size_t>(reused)), 1).ok());
    append(out, *c);
    // Copy-on-write: sequence 2 forks 0 and both write into the shared partial block.
    REQUIRE(c->kv().fork(0, 2).ok());
    const BatchToken both[] = {{7, 0, true}, {9, 2, true}};
    REQUIRE(c->decode(both).ok());
    append(out, *c);
    CHECK(c->kv().stats().cow_copies >= 1);
  }
  CHECK(bitwise_equal(got[0], got[1]));

  // Greedy generation of three requests at once through the scheduler.
  std::vector<int32_t> tokens[2];
  i = 0;
  for (Context* c : {ref.get(), split.get()}) {
    for (int32_t s = 0; s < 3; ++s) c->kv().clear(s);
    Scheduler sched(*c, l.tok);
    std::vector<int32_t>& toks = tokens[i++];
    for (const char* p : {"First Citizen:\n", "All:\nSpeak, speak.", "MENENIUS:\nWhy, masters"}) {
      Request r;
      r.prompt = l.tok->encode(p, {.add_special = true});
      r.params.sampling.temperature = 0.f;
      r.params.max_tokens = 12;
      r.params.ignore_eos = true;
      r.on_event = [&toks](const StreamEvent& e) {
        if (e.token >= 0) toks.push_back(e.token);
      };
      REQUIRE(sched.submit(std::move(r)).ok());
    }
    REQUIRE(sched.run_until_idle().ok());
  }
  CHECK(tokens[0].size() == 36);
  CHECK(tokens[0] == tokens[1]);
  CHECK(split->split_stats().copies > 0);
}

TEST_CASE("split: bad placements are clear errors") {
  const LoadedModel& l = load_model("gguf/qwen3-tiny-f16.gguf");
  ContextOptions o;
  o.n_ctx = 64;
  o.gpu_layers = -3;
  auto bad = Context::create(l.model, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find(
            "gpu_layers must be -1 (every layer), -2 (as many as fit) or a layer count >= 0, got -3") !=
        std::string::npos);
  o.gpu_layers = 1;
  o.device = "nope";
  auto unknown = Context::create(l.model, o);
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message.find("unknown device 'nope'") != std::string::npos);
  o.device = "cpu";
  o.placement = [](int32_t layer) { return layer == 1 ? 2 : 0; };
  auto out_of_range = Context::create(l.model, o);
  REQUIRE_FALSE(out_of_range.ok());
  CHECK(out_of_range.error().message.find("model part 1 is placed on backend 2") != std::string::npos);
}

TEST_CASE("split: kite run --gpu-layers prints the unsplit text, bad values and a missing GPU are clear errors") {
  const std::string m = testdata("models/llama-target");
  const std::vector<std::string> base{"run", "-m", m, "-p", "First Citizen:\n", "-n", "16", "--temp", "0", "-t", "2"};
  auto plain = run_kite(base);
  REQUIRE(plain.exit_code == 0);
  REQUIRE(plain.out.size() > 10);
  for (const char* n : {"2", "all", "0"}) {
    auto args = base;
    args.insert(args.end(), {"--device", "cpu", "--gpu-layers", n});
    auto split = run_kite(args);
    INFO(split.err);
    CHECK(split.exit_code == 0);
    CHECK(split.out == plain.out);
  }
  for (const char* n : {"abc", "-2", "1.5"}) {
    auto args = base;
    args.insert(args.end(), {std::string("--gpu-layers=") + n});
    auto r = run_kite(args);
    CAPTURE(n);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--gpu-layers '" + std::string(n) + "': expected a layer count") != std::string::npos);
  }
  // --device cuda: without a GPU (or without CUDA) a clear error, with one it runs.
  auto args = base;
  args.insert(args.end(), {"--device", "cuda", "--gpu-layers", "2"});
  auto cuda = run_kite(args);
  if (auto be = create_backend("cuda"); !be.ok()) {
    CHECK(cuda.exit_code != 0);
    CHECK(cuda.err.find(be.error().message) != std::string::npos);
  } else {
    CHECK(cuda.exit_code == 0);
  }
}

namespace {

// A "device" with little memory: a CPU backend behind a Backend that reports `g_free` bytes
// free, so the load-time memory check runs without a GPU. Its buffers name it as their backend.
size_t g_free = 0;

class SmallDevice final : public Backend {
 public:
  explicit SmallDevice(std::unique_ptr<Backend> cpu) : cpu_(std::move(cpu)) {}
  std::string_view name() const override { return "small-device"; }
  bool is_host() const override { return true; }
  bool supports(const Tensor& n) const override { return cpu_->supports(n); }
  Result<std::unique_ptr<Buffer>> alloc(size_t bytes) override {
    KITE_ASSIGN_OR_RETURN(auto inner, cpu_->alloc(bytes));
    return std::unique_ptr<Buffer>(std::make_unique<Wrapped>(*this, std::move(inner)));
  }
  Status upload(const Tensor& t, const void* src, size_t bytes, size_t offset) override {
    return cpu_->upload(t, src, bytes, offset);
  }
  Status download(const Tensor& t, void* dst, size_t bytes, size_t offset) const override {
    return cpu_->download(t, dst, bytes, offset);
  }
  Status compute(std::span<Tensor* const> nodes) override { return cpu_->compute(nodes); }
  std::optional<MemoryInfo> memory_info() const override { return MemoryInfo{g_free, 2 * g_free}; }

 private:
  struct Wrapped final : Buffer {
    Wrapped(Backend& b, std::unique_ptr<Buffer> in) : owner(b), inner(std::move(in)) {}
    void* base() override { return inner->base(); }
    size_t size() const override { return inner->size(); }
    Backend& backend() override { return owner; }
    Backend& owner;
    std::unique_ptr<Buffer> inner;
  };
  std::unique_ptr<Backend> cpu_;
};

}  // namespace

TEST_CASE(
    "split: a model that does not fit the device is an error at load that names a --gpu-layers that fits, and auto "
    "picks it") {
  static const bool registered = [] {
    register_backend("small-device", [](const BackendOptions& o) -> Result<std::unique_ptr<Backend>> {
      KITE_ASSIGN_OR_RETURN(auto cpu, create_backend("cpu", o));
      return std::unique_ptr<Backend>(std::make_unique<SmallDevice>(std::move(cpu)));
    });
    return true;
  }();
  REQUIRE(registered);
  const LoadedModel& l = load_model("models/llama-target");
  const int32_t n_layer = static_cast<int32_t>(l.model->hparams().n_layer);
  ContextOptions o;
  o.n_threads = 2;
  o.n_ctx = 256;
  o.device = "small-device";
  const size_t kv_layer = KvCache::layer_bytes(l.model->hparams(), o.kv_type, o.kv_block_size, 256 / 16);
  // Room for the head and two layers (weights and KV) but not three.
  auto bytes_for = [&](int32_t k) {
    return l.model->weight_bytes([&](int32_t layer) { return layer >= n_layer - k; }) +
           static_cast<size_t>(k) * kv_layer;
  };
  g_free = (bytes_for(2) + bytes_for(3)) / 2;
  for (int32_t k : {-1, n_layer, 3}) {
    o.gpu_layers = k;
    auto c = Context::create(l.model, o);
    CAPTURE(k);
    REQUIRE_FALSE(c.ok());
    const std::string& m = c.error().message;
    INFO(m);
    if (k == -1) MESSAGE(m);
    CHECK(m.find("small-device: the model does not fit in device memory: ") == 0);
    CHECK(m.find(" MiB are free; run fewer layers on the device (--gpu-layers 2 would fit; --gpu-layers auto picks "
                 "as many as fit)") != std::string::npos);
  }
  o.gpu_layers = 2;
  auto fits = Context::create(l.model, o);
  REQUIRE_MESSAGE(fits.ok(), (fits.ok() ? std::string() : fits.error().message));
  CHECK((*fits)->n_backends() == 2);
  CHECK((*fits)->backend(1).name() == "small-device");
  const auto prompt = l.tok->encode("First Citizen:", {.add_special = true});
  REQUIRE((*fits)->eval(prompt, 0).ok());
  auto ref = make_ctx(l, -1);
  REQUIRE(ref->eval(prompt, 0).ok());
  CHECK(std::memcmp((*fits)->logits(0).data(), ref->logits(0).data(), ref->logits(0).size_bytes()) == 0);

  // --gpu-layers auto: as many as fit with a tenth of the free memory to spare (here 2, as above);
  // the whole model where it fits; the CPU alone where not even the head does.
  const size_t room = g_free;
  for (const size_t free : {room, size_t{1} << 40, size_t{1} << 20}) {
    CAPTURE(free);
    g_free = free;
    o.gpu_layers = kGpuLayersAuto;
    auto c = Context::create(l.model, o);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.error().message));
    const int32_t want = free == room ? 2 : free > room ? -1 : 0;
    CHECK((*c)->auto_gpu_layers() == want);
    CHECK((*c)->n_backends() == (want > 0 ? 2u : 1u));
    CHECK((*c)->backend((*c)->n_backends() - 1).name() == (want == 0 ? "cpu" : "small-device"));
    REQUIRE((*c)->eval(prompt, 0).ok());
    CHECK(std::memcmp((*c)->logits(0).data(), ref->logits(0).data(), ref->logits(0).size_bytes()) == 0);
  }
  g_free = room;
  o.gpu_layers = 2;  // (a count given is not an auto choice)
  auto given = Context::create(l.model, o);
  REQUIRE(given.ok());
  CHECK_FALSE((*given)->auto_gpu_layers().has_value());
}
