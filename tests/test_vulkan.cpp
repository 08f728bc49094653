// The Vulkan backend, on whatever Vulkan device the machine has (in CI: lavapipe, Mesa's CPU
// driver, a real Vulkan implementation). Without a device the tests skip visibly, unless
// KITE_REQUIRE_VULKAN=1 (set by .ci/run), where a missing device fails. Op conformance on Vulkan
// is test_ops.cpp's (every op on every registered backend); here: the device and its memory,
// whole models against the CPU, weights shared between contexts, and split placement.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "src/core/backend.h"
#include "src/core/graph.h"
#include "tests/gpu_checks.h"
#include "tests/ops_test_util.h"
#include "tests/process.h"
#include "tests/profile_checks.h"
#include "tests/testdata.h"
#ifdef KITE_VULKAN
#include "backends/vulkan/vulkan_backend.h"
#endif

using namespace kite;
using namespace kite::test;

namespace {

std::vector<std::string> devices() {
#ifdef KITE_VULKAN
  return vk::vulkan_devices();
#else
  return {};
#endif
}

size_t mirrored_bytes() {
#ifdef KITE_VULKAN
  return vk::vulkan_mirrored_bytes(0);
#else
  return 0;
#endif
}

bool unified_memory() {
#ifdef KITE_VULKAN
  return vk::vulkan_unified_memory(0);
#else
  return false;
#endif
}

// True when the Vulkan tests can run; otherwise says why, visibly (a failure where
// KITE_REQUIRE_VULKAN=1).
bool have_vulkan(const char* what) {
  const char* req = std::getenv("KITE_REQUIRE_VULKAN");
  const bool required = req != nullptr && std::string_view(req) == "1";
#ifndef KITE_VULKAN
  if (required) FAIL("KITE_REQUIRE_VULKAN=1 but the Vulkan backend is not compiled in (KITE_VULKAN=OFF)");
  MESSAGE("vulkan: skipped (", std::string(what), "), backend not compiled in");
  return false;
#else
  if (!devices().empty()) return true;
  auto be = create_backend("vulkan");
  const std::string why = be.ok() ? std::string("?") : be.error().message;
  if (required) FAIL("KITE_REQUIRE_VULKAN=1 but there is no Vulkan device: ", why);
  MESSAGE("vulkan: skipped (", std::string(what), "): ", why);
  return false;
#endif
}

}  // namespace

TEST_CASE("vulkan: devices are listed, and no device or a missing one is a clear error") {
  auto be = create_backend("vulkan");
#ifndef KITE_VULKAN
  REQUIRE_FALSE(be.ok());
  CHECK(be.error().message.find("unknown device 'vulkan'") != std::string::npos);
  return;
#endif
  if (!have_vulkan("devices")) {
    REQUIRE_FALSE(be.ok());
    CHECK(be.error().message.find("vulkan: no Vulkan device found") == 0);
    return;
  }
  const auto names = devices();
  MESSAGE("vulkan devices: ", names.size(), ", the first: ", names[0]);
  REQUIRE_MESSAGE(be.ok(), (be.ok() ? std::string() : be.error().message));
  CHECK((*be)->name() == "vulkan");
  CHECK_FALSE((*be)->is_host());
  REQUIRE((*be)->memory_info().has_value());
  CHECK((*be)->memory_info()->total > 0);
  BackendOptions bad;
  bad.device = static_cast<int>(names.size());
  auto b2 = create_backend("vulkan", bad);
  REQUIRE_FALSE(b2.ok());
  CHECK(b2.error().message.find("does not exist") != std::string::npos);
}

TEST_CASE("vulkan: bytes round-trip through device buffers and copy on the device") {
  if (!have_vulkan("buffers")) return;
  auto be = create_backend("vulkan");
  REQUIRE(be.ok());
  Backend& b = **be;
  auto buf = b.alloc(1 << 20);
  REQUIRE(buf.ok());
  Tensor a, c;
  a.type = c.type = DType::F32;
  a.ne = c.ne = {1000, 1, 1, 1};
  a.nb = c.nb = contiguous_strides(DType::F32, a.ne);
  a.name = "a", c.name = "c";
  a.data = (*buf)->base();
  c.data = static_cast<uint8_t*>((*buf)->base()) + 8192;
  a.buffer = c.buffer = buf->get();
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f - 7.f;
  REQUIRE(b.upload(a, x.data(), 4000).ok());
  REQUIRE(b.copy(c, 40, a, 0, 3960).ok());  // c[10..999] = a[0..989]
  std::vector<float> back(1000, -1.f), moved(1000, -1.f);
  REQUIRE(b.download(a, back.data(), 4000).ok());
  REQUIRE(b.download(c, moved.data() + 10, 3960, 40).ok());
  CHECK(back == x);
  CHECK(std::equal(moved.begin() + 10, moved.end(), x.begin()));
  // Rows gathered with one wait (Backend::download_many), out of order and one twice.
  const size_t offsets[] = {2000, 0, 400, 2000};
  std::vector<float> rows(4 * 100, -1.f);
  REQUIRE(b.download_many(a, offsets, 400, rows.data()).ok());
  for (size_t r = 0; r < 4; ++r) CHECK(std::equal(rows.begin() + r * 100, rows.begin() + r * 100 + 100, x.begin() + offsets[r] / 4));
  const size_t past[] = {0, (size_t{1} << 20) - 100};  // (the second runs past the 1 MiB buffer)
  CHECK_FALSE(b.download_many(a, past, 400, rows.data()).ok());
  // More than the 16 MiB staging buffer holds, where transfers go through it.
  auto big = b.alloc(size_t{40} << 20);
  REQUIRE(big.ok());
  Tensor t = a;
  t.ne = {10 << 20, 1, 1, 1};
  t.nb = contiguous_strides(DType::F32, t.ne);
  t.data = (*big)->base();
  t.buffer = big->get();
  std::vector<float> y(size_t{10} << 20), z(y.size(), 0.f);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(i % 100003);
  REQUIRE(b.upload(t, y.data(), y.size() * 4).ok());
  REQUIRE(b.download(t, z.data(), z.size() * 4).ok());
  CHECK(z == y);
  // 4 MiB each, 20 MiB in all: two loads of the staging buffer (four rows, then one).
  const size_t wide[] = {size_t{36} << 20, 0, size_t{20} << 20, size_t{8} << 20, size_t{36} << 20};
  std::vector<float> w(5 * (size_t{1} << 20));
  REQUIRE(b.download_many(t, wide, size_t{4} << 20, w.data()).ok());
  for (size_t r = 0; r < 5; ++r)
    CHECK(std::equal(w.begin() + static_cast<ptrdiff_t>(r << 20), w.begin() + static_cast<ptrdiff_t>((r + 1) << 20),
                     y.begin() + static_cast<ptrdiff_t>(wide[r] / 4)));
  // KITE_VULKAN_STAGING=1 (a ctest of its own): every transfer above went through staging copies.
  const char* staged = std::getenv("KITE_VULKAN_STAGING");
  if (staged != nullptr && std::string_view(staged) == "1") CHECK_FALSE(unified_memory());
  MESSAGE("vulkan: buffers ", std::string(unified_memory() ? "host-visible (mapped)" : "device-only (staging copies)"));
  // A tensor outside the device's buffers is an error naming it, not a wild write.
  Tensor host = a;
  host.data = x.data();
  host.name = "host";
  auto st = b.upload(host, x.data(), 16);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message.find("'host'") != std::string::npos);
}

TEST_CASE("vulkan: the GPU-shaped mul_mat (forced on lavapipe) matches the reference for every type") {
  if (!have_vulkan("gpu mul_mat")) return;
  // A CPU device (lavapipe) takes the row-per-lane kernels; real GPUs the k-split ones, which
  // KITE_VULKAN_MATMUL=gpu forces here so CI runs them too.
  setenv("KITE_VULKAN_MATMUL", "gpu", 1);
  uint32_t seed = 900;
  // n 1 and 9: mmv_gpu; 70: the tiled kernel (two column tiles, the second partial; m 37 is a
  // partial row tile, m 130 three).
  for (DType t : ops_test::kQuantTypes)
    for (int64_t n : {1, 9, 70}) ops_test::check_mul_mat(t, 512, 37, n, 1, false, seed++);
  for (DType t : ops_test::kQuantTypes) ops_test::check_mul_mat(t, 256, 130, 33, 1, false, seed++);
  for (DType t : ops_test::kIqTypes)
    for (int64_t n : {1, 9, 70}) ops_test::check_mul_mat(t, 512, 37, n, 1, false, seed++);
  for (DType t : ops_test::kFloatTypes) {
    ops_test::check_mul_mat(t, 520, 21, 1, 1, false, seed++);
    ops_test::check_mul_mat(t, 67, 13, 3, 1, false, seed++);
    ops_test::check_mul_mat(t, 520, 70, 40, 1, false, seed++);  // tiled, rows 16-byte aligned
    ops_test::check_mul_mat(t, 67, 13, 65, 1, false, seed++);   // tiled, a partial last chunk
  }
  ops_test::check_mul_mat(DType::Q4_K, 256, 21, 5, 2, true, seed++);   // 3-D, strided
  ops_test::check_mul_mat(DType::Q4_K, 256, 21, 20, 3, true, seed++);  // tiled, 3-D, strided
  // KITE_VULKAN_TILED=1: the tiled kernel from 2 columns on (a tile almost all padding).
  setenv("KITE_VULKAN_TILED", "1", 1);
  for (DType t : {DType::Q6_K, DType::Q8_0, DType::F16}) ops_test::check_mul_mat(t, 256, 37, 2, 1, false, seed++);
  unsetenv("KITE_VULKAN_TILED");
  unsetenv("KITE_VULKAN_MATMUL");
}

TEST_CASE("vulkan: greedy output of the F16 test models equals the CPU's (except near-ties)") {
  if (!have_vulkan("greedy equality")) return;
  check_greedy_matches_cpu("vulkan",
                           {"gguf/stories260K-F16.gguf", "gguf/llama-draft-f16.gguf", "gguf/qwen2-tiny-f16.gguf",
                            "gguf/qwen3-tiny-f16.gguf", "models/qwen3-tiny"},
                           24);
}

TEST_CASE("vulkan: quantized GGUF perplexity equals the CPU's on the same text") {
  if (!have_vulkan("perplexity")) return;
  // Every quantization type of the draft model and the target's Q4_K_M, over 4 chunks of 256.
  check_perplexity("vulkan",
                   {"llama-draft-Q2_K.gguf", "llama-draft-Q3_K_M.gguf", "llama-draft-Q4_0.gguf",
                    "llama-draft-Q4_1.gguf", "llama-draft-Q4_K_M.gguf", "llama-draft-Q5_0.gguf",
                    "llama-draft-Q5_1.gguf", "llama-draft-Q5_K_M.gguf", "llama-draft-Q6_K.gguf",
                    "llama-draft-Q8_0.gguf", "llama-target-Q4_K_M.gguf", "stories260K-Q4_0.gguf"},
                   1024);
  // The codebook types IQ1_S..IQ3_S, all in one llama.cpp-quantized file (tests/data/README.md).
  const std::string dir = std::string(KITE_SOURCE_DIR) + "/tests/data";
  check_perplexity("vulkan", {}, 1024, 0.005, PplReference{dir + "/iq-mix-reference.json", dir});
}

TEST_CASE("vulkan: a sequence's greedy tokens do not depend on what shares its batch") {
  if (!have_vulkan("batch invariance")) return;
  check_batch_invariance("vulkan", "gguf/llama-draft-Q4_K_M.gguf", 12);
}

TEST_CASE("vulkan: an MoE model runs, its experts on the CPU: the CPU's greedy tokens and perplexity") {
  if (!have_vulkan("moe")) return;
  check_moe("vulkan", 1024);
}

TEST_CASE("vulkan: gemma2 and gemma3 models (sliding windows, soft-capping): the CPU's greedy tokens, llama.cpp's perplexity") {
  if (!have_vulkan("gemma3")) return;
  check_gemma("vulkan", 1024);
}

TEST_CASE("vulkan: steps that bring back each row's top 64 logits (and some whole rows) match whole rows") {
  if (!have_vulkan("top-k outputs")) return;
  check_top_k_outputs("vulkan");
}

TEST_CASE("vulkan: the scheduler's rows drawn on the device, fetched or whole give the host's tokens") {
  if (!have_vulkan("scheduler rows")) return;
  check_scheduler_rows("vulkan");
}

TEST_CASE("vulkan: a profiled step times each node by GPU timestamps, with the unprofiled step's logits") {
  if (!have_vulkan("profiling")) return;
  const auto rows = check_profiled_step("vulkan");
  CHECK(profile_calls(rows, "attention attn") == 2);  // (llama-draft: 2 layers, a node a launch)
  CHECK(profile_calls(rows, "mul_mat q4_K 256x256 q") == 2);
}

TEST_CASE("vulkan: contexts on one model share one copy of its weights on the device") {
  if (!have_vulkan("shared weights")) return;
  check_shared_weights("vulkan", mirrored_bytes);
}

TEST_CASE("vulkan: the last layers on the device, the rest on the CPU, give the CPU's logits") {
  if (!have_vulkan("split placement")) return;
  check_split_placement("vulkan");
}

TEST_CASE("vulkan: kite run --device vulkan generates the CPU's text, and a bad device index is a clear error") {
  if (!have_vulkan("kite run")) return;
  const std::string model = testdata("gguf/stories260K-F16.gguf");
  const auto cpu = run_kite({"run", "-m", model, "-p", "Once upon", "-n", "12", "--temp", "0"});
  const auto gpu = run_kite({"run", "-m", model, "-p", "Once upon", "-n", "12", "--temp", "0", "--device", "vulkan"});
  REQUIRE_MESSAGE(gpu.exit_code == 0, gpu.err);
  CHECK(gpu.out == cpu.out);
  // "vulkan:N" names device N: one past the last is an error naming the device count.
  const std::string past = "vulkan:" + std::to_string(devices().size());
  const auto bad = run_kite({"run", "-m", model, "-p", "x", "-n", "1", "--device", past});
  CHECK(bad.exit_code != 0);
  CHECK(bad.exit_code < 128);
  CHECK(bad.err.find("does not exist") != std::string::npos);
  const auto junk = run_kite({"run", "-m", model, "-p", "x", "-n", "1", "--device", "vulkan:x"});
  CHECK(junk.exit_code != 0);
  CHECK(junk.err.find("expected a device index") != std::string::npos);
}
