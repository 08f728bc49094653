// The CUDA backend. Without a device (or without CUDA compiled in) the tests check the clean
// failure: no device is a clear error from create_backend and from `kite run --device cuda`,
// never a crash; the GPU tests then skip with a visible message. With a device: greedy output
// of the F16/BF16 test models equals the CPU's (except at near-ties), and every quantized GGUF
// file's perplexity is within 0.5% of llama.cpp's. (Op conformance on CUDA is test_ops.cpp's:
// every op runs on every registered backend.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "src/core/backend.h"
#include "tests/gpu_checks.h"
#include "tests/ops_test_util.h"
#include "tests/process.h"
#include "tests/profile_checks.h"
#include "tests/testdata.h"
#ifdef KITE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif
#ifdef KITE_CUDA_EMU
#include "backends/cuda/emu/runtime.h"
#include "backends/cuda/kernels.h"
#endif

using namespace kite;
using namespace kite::test;

namespace {

bool cuda_compiled() {
  const auto names = backend_names();
  return std::find(names.begin(), names.end(), "cuda") != names.end();
}

int device_count() {
#ifdef KITE_CUDA
  return cuda::cuda_device_count();
#else
  return 0;
#endif
}

// True when the GPU tests can run; otherwise says why, visibly.
bool have_gpu(const char* what) {
  if (!cuda_compiled()) {
    MESSAGE("cuda: skipped (", std::string(what), "), CUDA backend not compiled in");
    return false;
  }
  if (device_count() == 0) {
    MESSAGE("cuda: skipped (", std::string(what), "), no CUDA device");
    return false;
  }
  return true;
}

}  // namespace

TEST_CASE("cuda: without a device the backend is a clear error, never a crash") {
  const int n = device_count();
  CHECK(n >= 0);
  auto be = create_backend("cuda");
  if (!cuda_compiled()) {
    MESSAGE("cuda: backend not compiled in (KITE_CUDA=OFF)");
    REQUIRE_FALSE(be.ok());
    CHECK(be.error().message.find("unknown device 'cuda'") != std::string::npos);
    return;
  }
  if (n > 0) {
    MESSAGE("cuda: ", n, " device(s) present");
    REQUIRE_MESSAGE(be.ok(), (be.ok() ? std::string() : be.error().message));
    CHECK((*be)->name() == "cuda");
    CHECK_FALSE((*be)->is_host());
    // A device index that does not exist is an error naming it.
    BackendOptions bad;
    bad.device = n;
    auto b2 = create_backend("cuda", bad);
    REQUIRE_FALSE(b2.ok());
    CHECK(b2.error().message.find("does not exist") != std::string::npos);
    return;
  }
  REQUIRE_FALSE(be.ok());
  MESSAGE(be.error().message);
  CHECK(be.error().message.find("cuda: no CUDA device found (cudaGetDeviceCount: ") == 0);
  // Asking twice gives the same answer (no sticky error state).
  auto again = create_backend("cuda");
  REQUIRE_FALSE(again.ok());
  CHECK(again.error().message == be.error().message);
  CHECK(device_count() == 0);
}

#ifdef KITE_CUDA
TEST_CASE("cuda: cuBLAS is opened on demand with every entry point kite calls") {
  // The binary does not link cuBLAS (startup cost, machines without it): dlopen finds the
  // toolkit's library and every symbol resolves, device or not.
  const Status st = cuda::cuda_check_cublas();
  CHECK_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
}
#endif

TEST_CASE("cuda: kite run --device cuda fails cleanly without a device, generates the CPU's text with one") {
  const std::string model = testdata("gguf/stories260K-F16.gguf");
  const auto r = run_kite({"run", "-m", model, "-p", "Once upon", "-n", "12", "--temp", "0", "--device", "cuda"});
  if (cuda_compiled() && device_count() > 0) {
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto cpu = run_kite({"run", "-m", model, "-p", "Once upon", "-n", "12", "--temp", "0"});
    CHECK(r.out == cpu.out);
    return;
  }
  INFO("stderr: ", r.err);
  CHECK(r.exit_code != 0);
  CHECK(r.exit_code < 128);  // an error exit, not a signal
  if (cuda_compiled()) CHECK(r.err.find("no CUDA device found") != std::string::npos);
  else CHECK(r.err.find("unknown device 'cuda'") != std::string::npos);
}

TEST_CASE("cuda: greedy output of the F16 test models equals the CPU's (except near-ties)") {
  if (!have_gpu("greedy equality")) return;
  // (The BF16 safetensors folders are left out: with them the GPU run's test data would not fit
  // the device tool's 64 MiB; BF16 weights are covered by the op conformance test.)
  check_greedy_matches_cpu("cuda",
                           {"gguf/stories260K-F16.gguf", "gguf/llama-draft-f16.gguf", "gguf/qwen2-tiny-f16.gguf",
                            "gguf/qwen3-tiny-f16.gguf"},
                           48);
}

TEST_CASE("cuda: every GGUF file within 0.5% of llama.cpp's ppl_ctx256 on the GPU") {
  if (!have_gpu("perplexity")) return;
#ifdef KITE_CUDA_EMU
  // On the CPU emulator every file still runs, over 512 tokens (two 256-token windows, 256 scored)
  // against the CPU backend on the same span: the whole text would take many minutes per file.
  // Over so few tokens the int8 activations' rounding flips (the CPU's and the GPU's attention
  // sum in different orders) move a tiny model's perplexity by up to ~0.7% (stories260K-Q8_0:
  // 0.64% with the int8 tensor-core matmul), so the bound here is 1%; a broken kernel is off by
  // far more. The 0.5% goal is checked on a GPU, over the whole text, against llama.cpp.
  check_perplexity("cuda", {}, 512, 0.01);
#else
  check_perplexity("cuda", {}, 0);
#endif
}

// The codebook types (IQ1_S..IQ3_S), all in one llama.cpp-quantized file (tests/data/README.md).
TEST_CASE("cuda: the IQ codebook mix within 0.5% of llama.cpp's ppl_ctx256 on the GPU") {
  if (!have_gpu("perplexity")) return;
  const std::string dir = std::string(KITE_SOURCE_DIR) + "/tests/data";
  const PplReference iq{dir + "/iq-mix-reference.json", dir};
#ifdef KITE_CUDA_EMU
  check_perplexity("cuda", {}, 512, 0.01, iq);  // (as the test above, on the emulator)
#else
  check_perplexity("cuda", {}, 0, 0.005, iq);
#endif
}

TEST_CASE("cuda: a sequence's greedy tokens do not depend on what shares its batch") {
  if (!have_gpu("batch invariance")) return;
  check_batch_invariance("cuda", "gguf/llama-draft-Q4_K_M.gguf", 16);
}

TEST_CASE("cuda: an MoE model runs, its experts on the CPU: the CPU's greedy tokens, llama.cpp's perplexity") {
  if (!have_gpu("moe")) return;
#ifdef KITE_CUDA_EMU
  check_moe("cuda", 512, 0.01);  // (as the perplexity test above, on the emulator)
#else
  check_moe("cuda", 0);
#endif
}

TEST_CASE("cuda: gemma2 and gemma3 models (windows, soft-capping): the CPU's greedy tokens, llama.cpp's perplexity") {
  if (!have_gpu("gemma3")) return;
#ifdef KITE_CUDA_EMU
  check_gemma("cuda", 512, 0.01);  // (as the perplexity test above, on the emulator)
#else
  check_gemma("cuda", 0);
#endif
}

TEST_CASE("cuda: steps that bring back each row's top 64 logits (and some whole rows) match whole rows") {
  if (!have_gpu("top-k outputs")) return;
  check_top_k_outputs("cuda");
}

TEST_CASE("cuda: the scheduler's rows drawn on the device, fetched or whole give the host's tokens") {
  if (!have_gpu("scheduler rows")) return;
  check_scheduler_rows("cuda");
}

TEST_CASE("cuda: contexts on one model share one copy of its weights on the GPU") {
  if (!have_gpu("shared weights")) return;
#ifdef KITE_CUDA
  check_shared_weights("cuda", [] { return cuda::cuda_mirrored_bytes(0); });
#endif
}

TEST_CASE("cuda: the last layers on the GPU, the rest on the CPU, give the CPU's logits") {
  if (!have_gpu("split placement")) return;
  check_split_placement("cuda");
}

TEST_CASE("cuda: decode steps replayed as CUDA graphs give the eager steps' logits, bit for bit, without host work") {
  if (!have_gpu("CUDA graphs")) return;
#ifdef KITE_CUDA
  // KITE_CUDA_GRAPHS is read when a backend is created: one context with graphs (the default),
  // one without (=0), decoding the same greedy tokens in lockstep (one and two sequences a step).
  for (const char* name : {"gguf/llama-draft-Q4_K_M.gguf", "gguf/qwen3-tiny-f16.gguf"}) {
    const LoadedModel& l = load_model(name);
    std::unique_ptr<Context> graphs, eager;
    {
      const ops_test::ScopedEnv on("KITE_CUDA_GRAPHS", nullptr);
      graphs = make_device_ctx(l, "cuda", 256, 2);
    }
    {
      const ops_test::ScopedEnv off("KITE_CUDA_GRAPHS", "0");
      eager = make_device_ctx(l, "cuda", 256, 2);
    }
    const uint64_t before = cuda::cuda_graph_launches();
    EncodeOptions eo;
    for (Context* c : {graphs.get(), eager.get()}) {
      REQUIRE(c->eval(l.tok->encode("Once upon a time", eo), 0).ok());
      REQUIRE(c->eval(l.tok->encode("The king said", eo), 1).ok());
    }
    int32_t t0 = argmax_of(eager->logits(0)), t1 = argmax_of(eager->logits(1));
    int mismatched = 0;
#ifdef KITE_CUDA_EMU
    // What a replayed step asks of the host: no allocation, no kernel launched one by one, one
    // copy of the inputs up, one wait (for the logits); op by op, no allocation either once the
    // scratch has grown.
    using kite::cuda::emu::counters;
    struct Step {
      uint64_t mallocs, frees, waits, launches, graphs, uploads;
    };
    auto since = [](const kite::cuda::emu::Counters& a) {
      const kite::cuda::emu::Counters b = counters();
      return Step{b.mallocs - a.mallocs,   b.frees - a.frees,
                  b.host_waits - a.host_waits, b.launches - a.launches,
                  b.graph_launches - a.graph_launches, b.uploads - a.uploads};
    };
    int steady_graph_steps = 0, steady_eager_steps = 0;
#endif
    for (int step = 0; step < 24; ++step) {
      const BatchToken two[2] = {{t0, 0, true}, {t1, 1, true}};
      const std::span<const BatchToken> batch(two, step < 12 ? 1 : 2);  // one sequence, then two
#ifdef KITE_CUDA_EMU
      const bool steady = step >= 4 && step < 12;  // (a batch size's first steps run eager, then capture)
      for (Context* c : {graphs.get(), eager.get()}) {
        const kite::cuda::emu::Counters before_step = counters();
        REQUIRE(c->decode(batch).ok());
        const Step d = since(before_step);
        if (!steady) continue;
        CHECK(d.mallocs == 0);
        CHECK(d.frees == 0);
        CHECK(d.uploads == 1);  // (tokens, positions, slots, ... and the block table: one span)
        if (c == graphs.get()) {
          steady_graph_steps += d.graphs == 1 && d.launches == 0 && d.waits == 1;
        } else {
          steady_eager_steps += d.graphs == 0 && d.launches > 10 && d.waits == 1;
        }
      }
#else
      for (Context* c : {graphs.get(), eager.get()}) REQUIRE(c->decode(batch).ok());
#endif
      for (int s = 0; s < static_cast<int>(batch.size()); ++s) {
        const auto a = graphs->logits(s), b = eager->logits(s);
        mismatched += !std::equal(a.begin(), a.end(), b.begin(), b.end());
      }
      t0 = argmax_of(eager->logits(0));
      if (batch.size() == 2) t1 = argmax_of(eager->logits(1));
    }
    const uint64_t launched = cuda::cuda_graph_launches() - before;
    MESSAGE(std::string(name), ": ", launched, " steps launched as graphs");
    CHECK(mismatched == 0);
    CHECK(launched > 10);
#ifdef KITE_CUDA_EMU
    CHECK(steady_graph_steps == 8);
    CHECK(steady_eager_steps == 8);
#endif
  }
#endif
}

TEST_CASE("cuda: a profiled step times each launch as fused, with the graph-replayed step's logits") {
  if (!have_gpu("profiling")) return;
  // (check_profiled_step: bit-equal logits, every matrix read once, a time for each launch.)
  const auto gpu = check_profiled_step("cuda"), cpu = check_profiled_step("cpu");
  int64_t launches = 0, nodes = 0, qkv = 0;
  for (const OpProfile::Row& r : gpu) {
    launches += r.calls;
    if (r.what.find(" q +k +v") != std::string::npos) qkv += r.calls;
  }
  for (const OpProfile::Row& r : cpu) nodes += r.calls;
  MESSAGE("a profiled decode step of llama-draft-Q4_K_M: ", launches, " CUDA launches, ", nodes, " CPU nodes");
  CHECK(launches < nodes);
  CHECK(qkv == 2);  // each layer's q, k and v in one launch
}

#ifdef KITE_CUDA
// Two contexts on one model, one run with the CUDA backend's fusions and one without
// (KITE_CUDA_FUSE=0, read at every step).
struct FusedPair {
  std::string model;
  std::unique_ptr<Context> fused, plain;
  // Runs `step` on both contexts, then checks that the first `rows` rows of logits are equal;
  // returns the launches (fused, unfused) on the emulator.
  std::pair<uint64_t, uint64_t> both(size_t rows, const std::function<Status(Context&)>& step) {
    std::pair<uint64_t, uint64_t> launches{0, 0};
    for (const bool fuse : {true, false}) {
      const ops_test::ScopedEnv env("KITE_CUDA_FUSE", fuse ? nullptr : "0");
#ifdef KITE_CUDA_EMU
      const uint64_t before = cuda::emu::counters().launches;
#endif
      const Status st = step(fuse ? *fused : *plain);
      REQUIRE_MESSAGE(st.ok(), model, ": ", (st.ok() ? std::string() : st.error().message));
#ifdef KITE_CUDA_EMU
      (fuse ? launches.first : launches.second) = cuda::emu::counters().launches - before;
#endif
    }
    for (size_t i = 0; i < rows; ++i) {
      const auto a = fused->logits(i), b = plain->logits(i);
      CHECK_MESSAGE(std::equal(a.begin(), a.end(), b.begin(), b.end()), model, ": logits row ", i);
    }
    return launches;
  }
};
#endif

TEST_CASE("cuda: fused launches give the unfused logits bit for bit, in fewer launches") {
  if (!have_gpu("fused launches")) return;
#ifdef KITE_CUDA
  // KITE_CUDA_FUSE is read at every step, so one context of each kind runs the same steps with
  // and without the fusions (ops.cpp run_fused): an rms_norm that also quantizes its rows for the
  // int8 matmuls after it (and attention for the output projection), q/k/v as one mat-vec
  // launch, gate/up with their swiglu (and its int8 activations) as another, the output
  // projections with their residual adds and (one sequence) the norms after those, the
  // two ropes with the two cache writes (float or Q8_0 caches), or (one sequence, llama's
  // adjacent rotary pairs, float caches, q, k and v of one type) those in the q/k/v launch,
  // qwen3's two per-head norms. Each node's arithmetic is the unfused one's,
  // so the logits must be equal to the bit. Graphs are off so that the emulator counts every
  // step's launches.
  const ops_test::ScopedEnv op_by_op("KITE_CUDA_GRAPHS", "0");
  struct Case {
    const char* model;
    int64_t saved_per_layer;  // launches a decode step of one sequence saves per layer
    int64_t rope_saved;       // saved by the q/k/v launches' rope tails (one sequence; one a layer)
    DType kv_type = DType::F16;
    const char* quantized = nullptr;  // the model as kite quantizes it to this type (load_quantized)
  };
  // int8 weights: the quantizations of q, k, v, gate and up's input (done by the norms), of the
  // attention output (done by the attention) and of the swiglu output (done by the gate/up
  // launch), 3 mat-vecs, the swiglu, 2 adds, a rope and 2 cache writes (float caches: the ropes
  // write them), and for one sequence the 2 norms (done by the adds' launches; the first layer's
  // norm and the output norm are not, so one less over the model); float weights (no int8 activations): all
  // but the quantizations; qwen3's per-head norms of q and k: one more. A Q8_0 cache saves as
  // many (its writes quantize k's rope as it is computed: llama's adjacent pairs, qwen3's halves).
  // The rope in the q/k/v launch (llama-draft-Q4_K_M's layer 1 has a Q6_K v: in the tails of
  // q and k's launch and of v's), with llama's adjacent rotary pairs or qwen2's rotated halves
  // (its q/k/v biases are part of the products), and qwen3's head norms before it (two launches
  // a layer saved: the norms' and the ropes'); float weights read the norm's output, which the
  // planner may give to the ropes (F16: no layer).
  for (const Case& tc :
       {Case{"gguf/llama-draft-Q4_K_M.gguf", 17, 2}, Case{"gguf/llama-draft-Q8_0.gguf", 17, 2},
        Case{"gguf/llama-draft-Q4_K_M.gguf", 17, 0, DType::Q8_0}, Case{"gguf/llama-draft-f16.gguf", 10, 0},
        Case{"gguf/qwen2-tiny-f16.gguf", 10, 0}, Case{"gguf/qwen2-tiny-f16.gguf", 17, 2, DType::F16, "Q4_K_M"},
        Case{"gguf/qwen3-tiny-f16.gguf", 11, 0, DType::Q8_0},
        Case{"gguf/qwen3-tiny-f16.gguf", 18, 4, DType::F16, "Q8_0"}}) {
    const LoadedModel& l = tc.quantized != nullptr ? load_quantized(tc.model, tc.quantized) : load_model(tc.model);
    FusedPair p{std::string(tc.model) + (tc.quantized != nullptr ? std::string(" as ") + tc.quantized : "") +
                    (tc.kv_type == DType::Q8_0 ? " (Q8_0 cache)" : ""),
                make_device_ctx(l, "cuda", 256, 2, tc.kv_type), make_device_ctx(l, "cuda", 256, 2, tc.kv_type)};
    EncodeOptions eo;
    // A 20-token prompt (9+ columns: the int8 tensor-core matmul shares its activations too), then
    // a short one, then decode steps of one and two sequences.
    const std::vector<int32_t> p0 = l.tok->encode("Once upon a time, the citizens of the old town gathered by the river", eo);
    const std::vector<int32_t> p1 = l.tok->encode("The king said", eo);
    p.both(1, [&](Context& c) { return c.eval(p0, 0); });
    p.both(1, [&](Context& c) { return c.eval(p1, 1); });
    int32_t t0 = argmax_of(p.plain->logits(0)), t1 = t0;
    for (int step = 0; step < 6; ++step) {
      const BatchToken two[2] = {{t0, 0, true}, {t1, 1, true}};
      const std::span<const BatchToken> batch(two, step < 3 ? 1 : 2);
      [[maybe_unused]] const auto [f, u] = p.both(batch.size(), [&](Context& c) { return c.decode(batch); });
      t0 = argmax_of(p.plain->logits(0));
      t1 = argmax_of(p.plain->logits(batch.size() - 1));
#ifdef KITE_CUDA_EMU
      if (step == 0 || step == 3) {
        MESSAGE(p.model, ": a decode step of ", batch.size(), " sequence(s): ", f, " launches fused, ", u, " unfused");
        const int64_t saved = tc.saved_per_layer - (batch.size() > cuda::kMaxNormTailCols ? 1 : 0);
        const int64_t rope = batch.size() > cuda::kMaxRopeTailCols ? 0 : tc.rope_saved;
        CHECK(u - f >= static_cast<uint64_t>(saved * l.model->hparams().n_layer + rope));
      }
#endif
    }
  }
  // Past one attention chunk (512 keys) a decode row's chunks are merged by the last of its
  // chunk blocks (by a second kernel unfused), which then writes the int8 activations.
  const LoadedModel& l = load_model("gguf/llama-draft-Q4_K_M.gguf");
  FusedPair p{"llama-draft-Q4_K_M at 600 tokens", make_device_ctx(l, "cuda", 1024), make_device_ctx(l, "cuda", 1024)};
  EncodeOptions eo;
  std::vector<int32_t> prompt = l.tok->encode(read_file(testdata("heldout.txt")), eo);
  REQUIRE(prompt.size() > 600);
  prompt.resize(600);
  p.both(1, [&](Context& c) { return c.eval(prompt, 0); });
  for (int step = 0; step < 2; ++step) {
    const BatchToken t{argmax_of(p.plain->logits(0)), 0, true};
    [[maybe_unused]] const auto [f, u] =
        p.both(1, [&](Context& c) { return c.decode(std::span<const BatchToken>(&t, 1)); });
#ifdef KITE_CUDA_EMU
    MESSAGE(p.model, ": a decode step: ", f, " launches fused, ", u, " unfused");
    CHECK(u - f >= static_cast<uint64_t>(18 * l.model->hparams().n_layer));  // (the merges too)
#endif
  }
#endif
}

#ifdef KITE_CUDA_EMU
TEST_CASE("cuda: a model that does not fit the GPU is a clear error at load, not a crash mid-request") {
  // The emulator's device memory is set by KITE_CUDA_EMU_MEMORY_MB (read at every query).
  setenv("KITE_CUDA_EMU_MEMORY_MB", "4", 1);
  const LoadedModel& l = load_model("gguf/llama-target-Q4_K_M.gguf");  // ~10 MB of weights
  ContextOptions opts;
  opts.n_ctx = 128;
  opts.device = "cuda";
  auto ctx = Context::create(l.model, opts);
  unsetenv("KITE_CUDA_EMU_MEMORY_MB");
  REQUIRE_FALSE(ctx.ok());
  MESSAGE(ctx.error().message);
  CHECK(ctx.error().message.find("memory") != std::string::npos);
  // With the memory back the same model loads and runs.
  auto ok = Context::create(l.model, opts);
  REQUIRE_MESSAGE(ok.ok(), (ok.ok() ? std::string() : ok.error().message));
  EncodeOptions eo;
  CHECK((*ok)->eval(l.tok->encode("Once upon a time", eo)).ok());
}
#endif

#ifdef KITE_CUDA_EMU
TEST_CASE("cuda: --gpu-layers auto puts as many of the last layers as fit on the GPU, the rest on the CPU") {
  // The emulator's device memory is set by KITE_CUDA_EMU_MEMORY_MB (read at every query).
  struct Restore {
    ~Restore() { unsetenv("KITE_CUDA_EMU_MEMORY_MB"); }
  } restore;
  const LoadedModel& l = load_model("gguf/llama-target-Q4_K_M.gguf");  // 4 layers, ~10 MB of weights
  EncodeOptions eo;
  const std::vector<int32_t> prompt = l.tok->encode("Once upon a time", eo);
  auto cpu = make_device_ctx(l, "cpu", 128);
  REQUIRE(cpu->eval(prompt).ok());
  const auto ref = cpu->logits(0);
  // The layers placed at each memory size (MiB): none, some, more, all (-1: the embedding too).
  std::vector<int32_t> placed;
  for (const char* mib : {"1", "8", "10", "64"}) {
    CAPTURE(mib);
    setenv("KITE_CUDA_EMU_MEMORY_MB", mib, 1);
    ContextOptions opts;
    opts.n_ctx = 128;
    opts.device = "cuda";
    opts.gpu_layers = kGpuLayersAuto;
    auto ctx = Context::create(l.model, opts);
    REQUIRE_MESSAGE(ctx.ok(), (ctx.ok() ? std::string() : ctx.error().message));
    const std::optional<int32_t> n = (*ctx)->auto_gpu_layers();
    REQUIRE(n.has_value());
    placed.push_back(*n);
    // What it placed: the CPU for the first layers (and the embedding), the GPU for the rest.
    CHECK((*ctx)->n_backends() == (*n > 0 ? 2u : 1u));
    CHECK((*ctx)->backend(0).name() == (*n == 0 ? "cpu" : *n < 0 ? "cuda" : "cpu"));
    REQUIRE((*ctx)->eval(prompt).ok());
    const auto got = (*ctx)->logits(0);
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) num += (ref[i] - got[i]) * (ref[i] - got[i]), den += ref[i] * ref[i];
    CHECK(num / den < 1e-3);
  }
  MESSAGE("--gpu-layers auto at 1, 8, 10, 64 MiB: ", placed[0], ", ", placed[1], ", ", placed[2], ", ", placed[3]);
  CHECK(placed[0] == 0);
  CHECK(placed[1] > 0);
  CHECK(placed[1] < 4);
  CHECK(placed[2] >= placed[1]);
  CHECK(placed[3] == -1);
  // kite run says what it placed.
  setenv("KITE_CUDA_EMU_MEMORY_MB", "8", 1);
  const auto r = run_kite({"run", "-m", testdata("gguf/llama-target-Q4_K_M.gguf"), "--device", "cuda", "--gpu-layers",
                           "auto", "-n", "4", "-c", "128", "-p", "Once upon a time"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.err.find("kite: --gpu-layers auto: the last " + std::to_string(placed[1]) +
                   " of 4 layers and the output head on cuda, the rest on the CPU") != std::string::npos);
}
#endif

TEST_CASE("cuda: two GPU ranks (tensor parallelism over NCCL) give one GPU's logits and greedy text") {
#ifdef KITE_CUDA_EMU
  // Two emulated GPUs (the count is read at every query); the emulator's NCCL stand-in sums on
  // the host (backends/cuda/emu/nccl.cpp).
  setenv("KITE_CUDA_EMU_DEVICES", "2", 1);
  struct Restore {
    ~Restore() { unsetenv("KITE_CUDA_EMU_DEVICES"); }
  } restore;
#endif
  if (!have_gpu("tensor parallelism")) return;
  if (device_count() < 2) {
    MESSAGE("cuda: tensor parallelism skipped: ", device_count(), " GPU (needs 2)");
    return;
  }
  const LoadedModel& l = load_model("gguf/llama-target-Q4_K_M.gguf");
  // The prompt's matmuls on the int8 tensor-core kernel at both rank counts: a rank's half of a
  // weight is another shape, which timing could send the other way (cuBLAS: F16 activations),
  // and this tiny model's greedy text has near-ties.
  const ops_test::ScopedEnv mmq("KITE_CUDA_MMQ", "1");
  auto ctx = [&](int32_t ranks) {
    ContextOptions o;
    o.n_ctx = 128;
    o.device = "cuda";
    o.tensor_parallel = ranks;
    auto c = Context::create(l.model, o);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.error().message));
    return std::move(*c);
  };
#ifdef KITE_CUDA_EMU
  {  // Each rank's share is checked against its GPU's free memory at load (4 MiB: too little).
    setenv("KITE_CUDA_EMU_MEMORY_MB", "4", 1);
    ContextOptions o;
    o.n_ctx = 128;
    o.device = "cuda";
    o.tensor_parallel = 2;
    auto small = Context::create(l.model, o);
    unsetenv("KITE_CUDA_EMU_MEMORY_MB");
    REQUIRE_FALSE(small.ok());
    MESSAGE(small.error().message);
    CHECK(small.error().message.find("does not fit in device memory over 2 ranks: rank 0 needs") != std::string::npos);
  }
#endif
  auto one = ctx(1), two = ctx(2);
  CHECK(two->n_backends() == 2);
  CHECK(&two->kv().tensors(1).k[0]->buffer->backend() == &two->backend(1));  // rank 1's KV on GPU 1
  EncodeOptions eo;
  const std::vector<int32_t> prompt = l.tok->encode("Once upon a time, the king of the land said", eo);
  REQUIRE(one->eval(prompt).ok());
  REQUIRE(two->eval(prompt).ok());
  double num = 0, den = 0;
  const auto a = one->logits(0), b = two->logits(0);
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += a[i] * a[i];
  CHECK(num / den < 1e-4);  // (int8 activations: see test_tensor_parallel.cpp)
  int32_t t1 = argmax_of(a), t2 = argmax_of(b);
  for (int step = 0; step < 12; ++step) {
    REQUIRE(t1 == t2);
    const BatchToken x{t1, 0, true};
    REQUIRE(one->decode(std::span<const BatchToken>(&x, 1)).ok());
    REQUIRE(two->decode(std::span<const BatchToken>(&x, 1)).ok());
    t1 = argmax_of(one->logits(0));
    t2 = argmax_of(two->logits(0));
  }
}
