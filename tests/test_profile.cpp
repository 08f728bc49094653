// Profiling (src/core/profile.h): launch labels, the table, and the CPU backend's per-node
// timing. (CUDA's and Vulkan's: test_cuda.cpp, test_vulkan.cpp.)
#include <doctest/doctest.h>

#include "src/core/profile.h"
#include "tests/process.h"
#include "tests/profile_checks.h"

using namespace kite;
using namespace kite::test;

TEST_CASE("profile: a launch's label names its op, role, weight type and shape, then what it fused") {
  Tensor w, w6, x, q, k, v, rope, cache, view;
  w.type = DType::Q4_K, w.ne = {4096, 1024, 1, 1};
  w6.type = DType::Q6_K, w6.ne = {4096, 1024, 1, 1};
  w.nb = contiguous_strides(w.type, w.ne), w6.nb = contiguous_strides(w6.type, w6.ne);
  q.op = Op::kMulMat, q.src[0] = &w, q.src[1] = &x, q.name = "l12.q";
  k.op = Op::kMulMat, k.src[0] = &w, k.src[1] = &x, k.name = "l12.k";
  v.op = Op::kMulMat, v.src[0] = &w6, v.src[1] = &x, v.name = "l12.v";
  view.op = Op::kView, view.src[0] = &q, view.name = "l12.q";
  rope.op = Op::kRope, rope.src[0] = &view, rope.name = "l12.q_rope";
  cache.op = Op::kKvWrite, cache.name = "cache_k.12";
  Tensor* fused[] = {&q, &view, &k, &v, &rope, &cache};
  CHECK(profile_label(fused) == "mul_mat q4_K 4096x1024 q +k +v(q6_K) +q_rope +cache_k");
  Tensor* one[] = {&rope};
  CHECK(profile_label(one) == "rope q_rope");
  Tensor anon;
  anon.op = Op::kAdd;
  Tensor* unnamed[] = {&anon};
  CHECK(profile_label(unnamed) == "add");
  // Names that only look like a layer's keep their text.
  anon.name = "lm.head";
  CHECK(profile_label(unnamed) == "add lm.head");
  anon.name = "l7x.a";
  CHECK(profile_label(unnamed) == "add l7x.a");

  // Rows add up by label, most time first; views alone are not launches.
  OpProfile p;
  p.add(fused, 0.002);
  p.add(fused, 0.004);
  p.add(one, 0.001);
  Tensor* views[] = {&view};
  p.add(views, 1.0);
  const auto rows = p.rows();
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].what == profile_label(fused));
  CHECK(rows[0].calls == 2);
  CHECK(rows[0].seconds == doctest::Approx(0.006));
  CHECK(rows[0].weight_bytes == 2.0 * static_cast<double>(2 * w.nbytes() + w6.nbytes()));
  CHECK(rows[1].calls == 1);
  CHECK(rows[1].weight_bytes == 0);
  CHECK(p.seconds() == doctest::Approx(0.007));
  // The table: per step (2 steps), with the weights' GB/s and the wall clock's share.
  const std::string t = format_profile(p, 2, 0.014);
  INFO(t);
  CHECK(t.find("| mul_mat q4_K 4096x1024 q +k +v(q6_K) +q_rope +cache_k | 1 | 3.000 | 85.7 | 3000.0 | ") !=
        std::string::npos);
  CHECK(t.find("| rope q_rope | 0.5 | 0.500 | 14.3 | 1000.0 |  |") != std::string::npos);
  CHECK(t.find("| all launches | 1.5 | 3.500 | 100 | | |") != std::string::npos);
  CHECK(t.find("(by op: mul_mat 85.7%, rope 14.3%)") != std::string::npos);
  CHECK(t.find("(2 steps, 7.000 ms a step by the wall clock: the launches' time is 50% of it)") != std::string::npos);
  p.clear();
  CHECK(p.rows().empty());
}

TEST_CASE("profile: a CPU decode step, node by node, with the unprofiled step's logits") {
  const auto rows = check_profiled_step("cpu");
  // The CPU fuses nothing: a row per role, a call per layer (llama-draft has 2).
  for (const OpProfile::Row& r : rows) {
    CAPTURE(r.what);
    CHECK(r.what.find(" +") == std::string::npos);
  }
  CHECK(profile_calls(rows, "attention attn") == 2);
  CHECK(profile_calls(rows, "kv_write cache_k") == 2);
  CHECK(profile_calls(rows, "rms_norm attn_norm") == 2);
  CHECK(profile_calls(rows, "mul_mat q4_K 256x256 q") == 2);
}

TEST_CASE("profile: kite bench --profile prints each test's launches after the results") {
  const auto r = run_kite({"bench", "-m", testdata("gguf/llama-draft-Q4_K_M.gguf"), "-p", "16", "-n", "4", "-r", "1",
                           "-t", "2", "--profile"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  INFO(r.out);
  const size_t results = r.out.find("| tg4 |"), pp = r.out.find("profile of pp16 (cpu: "),
               tg = r.out.find("profile of tg4 (cpu: ");
  REQUIRE(results != std::string::npos);
  REQUIRE(pp != std::string::npos);
  REQUIRE(tg != std::string::npos);
  CHECK(results < pp);
  CHECK(pp < tg);
  CHECK(r.out.find("| mul_mat q6_K 256x4096 logits | 1 | ", tg) != std::string::npos);
  CHECK(r.out.find("(4 steps, ", tg) != std::string::npos);
  // Batched: each sequence count's run again, profiled.
  const auto b = run_kite({"bench", "-m", testdata("gguf/llama-draft-Q4_K_M.gguf"), "--parallel", "2", "-p", "8", "-n",
                           "4", "-t", "2", "--profile"});
  REQUIRE_MESSAGE(b.exit_code == 0, b.err);
  INFO(b.out);
  CHECK(b.out.find("profile of 2 sequences (prompts and generation) (cpu: ") != std::string::npos);
  CHECK(b.out.find("| attention attn | ") != std::string::npos);
}
