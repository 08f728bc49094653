// What every backend's profiling (Backend::set_profile, `kite bench --profile`) is held to
// (test_profile.cpp, test_cuda.cpp, test_vulkan.cpp).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "formats/weight_source.h"
#include "src/core/profile.h"
#include "tests/gpu_checks.h"

namespace kite::test {

// Bytes of the matrices one decode step of a GGUF file's model multiplies by: every 2D weight,
// the token embedding only where it is also the output matrix.
inline double matmul_weight_bytes(const std::string& path) {
  auto src = WeightSource::open(path);
  REQUIRE(src.ok());
  const bool tied = (*src)->find_tensor("output.weight") == nullptr;
  double bytes = 0;
  for (const TensorInfo& t : (*src)->tensors())
    if (t.ne.size() >= 2 && t.ne[1] > 1 && (tied || t.name != "token_embd.weight"))
      bytes += static_cast<double>(t.nbytes);
  return bytes;
}

// One decode step of llama-draft-Q4_K_M on `device`, profiled, beside the same step unprofiled
// in a second context: the logits equal bit for bit (profiling times launches, it does not change
// them); the launches read every matrix once (their weight bytes are the model's); each launch
// has a time; stopping the profile stops the counting. Returns the profile's rows.
inline std::vector<OpProfile::Row> check_profiled_step(const std::string& device) {
  const std::string rel = "gguf/llama-draft-Q4_K_M.gguf";
  const LoadedModel& l = load_model(rel);
  auto profiled = make_device_ctx(l, device, 64), plain = make_device_ctx(l, device, 64);
  EncodeOptions eo;
  const std::vector<int32_t> prompt = l.tok->encode("Once upon a time", eo);
  int32_t next = 0;
  for (Context* c : {profiled.get(), plain.get()}) {
    REQUIRE(c->eval(prompt).ok());
    next = argmax_of(c->logits(0));
    for (int i = 0; i < 3; ++i) {  // (past the steps that warm up: graphs are captured on the third)
      const BatchToken t{next, 0, true};
      REQUIRE(c->decode(std::span<const BatchToken>(&t, 1)).ok());
    }
  }
  next = argmax_of(plain->logits(0));
  OpProfile profile;
  for (size_t b = 0; b < profiled->n_backends(); ++b) {
    Result<std::string> how = profiled->backend(b).set_profile(&profile);
    REQUIRE_MESSAGE(how.ok(), device, ": ", (how.ok() ? std::string() : how.error().message));
    CHECK_FALSE(how->empty());
  }
  const BatchToken t{next, 0, true};
  for (Context* c : {profiled.get(), plain.get()}) REQUIRE(c->decode(std::span<const BatchToken>(&t, 1)).ok());
  const auto a = profiled->logits(0), b = plain->logits(0);
  CHECK_MESSAGE(std::equal(a.begin(), a.end(), b.begin(), b.end()), device, ": a profiled step's logits");

  const std::vector<OpProfile::Row> rows = profile.rows();
  REQUIRE(!rows.empty());
  double weights = 0;
  int64_t calls = 0;
  for (const OpProfile::Row& r : rows) {
    CAPTURE(r.what);
    CHECK(r.seconds > 0);
    CHECK(r.calls > 0);
    CHECK((r.weight_bytes > 0) == (r.what.rfind("mul_mat ", 0) == 0));
    weights += r.weight_bytes;
    calls += r.calls;
  }
  CHECK(weights == matmul_weight_bytes(testdata(rel)));
  CHECK(profile.seconds() > 0);
  // Stopped: another step adds nothing.
  for (size_t i = 0; i < profiled->n_backends(); ++i) REQUIRE(profiled->backend(i).set_profile(nullptr).ok());
  REQUIRE(profiled->decode(std::span<const BatchToken>(&t, 1)).ok());
  int64_t after = 0;
  for (const OpProfile::Row& r : profile.rows()) after += r.calls;
  CHECK(after == calls);
  return rows;
}

// The calls of the rows whose label is exactly `what`.
inline int64_t profile_calls(const std::vector<OpProfile::Row>& rows, const std::string& what) {
  int64_t n = 0;
  for (const OpProfile::Row& r : rows) n += r.what == what ? r.calls : 0;
  return n;
}

}  // namespace kite::test
