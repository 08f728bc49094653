#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "src/base/fast_exp.h"
#include "src/base/half.h"
#include "src/base/mapped_file.h"
#include "tests/testdata.h"

using namespace kite;

TEST_CASE("base: fp16 conversion round-trips every half value") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      CHECK((fp32_to_fp16(f) & 0x7c00) == 0x7c00);
      continue;
    }
    REQUIRE_MESSAGE(fp32_to_fp16(f) == h, "half 0x", std::hex, h);
  }
}

TEST_CASE("base: fp32 to fp16 rounds to nearest even") {
  CHECK(fp32_to_fp16(1.0f) == 0x3c00);
  CHECK(fp32_to_fp16(65504.0f) == 0x7bff);
  CHECK(fp32_to_fp16(65520.0f) == 0x7c00);  // rounds up to inf
  CHECK(fp32_to_fp16(1e-8f) == 0x0000);
  CHECK(fp32_to_fp16(5.9604645e-08f) == 0x0001);  // smallest subnormal
  CHECK(fp32_to_fp16(-2.0f) == 0xc000);
  // 1 + 2^-11 is halfway between 1 and the next half: ties to even (1.0)
  CHECK(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  CHECK(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
}

TEST_CASE("base: bf16 conversion") {
  CHECK(fp32_to_bf16(1.0f) == 0x3f80);
  CHECK(bf16_to_fp32(0x3f80) == 1.0f);
  CHECK(fp32_to_bf16(1.00390625f) == 0x3f80);  // halfway: ties to even
  CHECK(std::isnan(bf16_to_fp32(fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("base: mapped file errors name the file") {
  auto r = MappedFile::open("/nonexistent/kite-file");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("/nonexistent/kite-file") != std::string::npos);
  auto d = MappedFile::open("/tmp");
  REQUIRE_FALSE(d.ok());
  CHECK(d.error().message.find("not a regular file") != std::string::npos);
}

TEST_CASE("base: exp_approx is within 1 ulp of std::exp and 0 below the normal range, exp_masked drops -inf and NaN") {
  double worst = 0;  // in ulps of std::exp's result
  float worst_x = 0;
  int64_t n = 0;
  for (float x = -87.33f; x <= 88.3f; x += 1e-4f * (1.f + std::abs(x)), ++n) {
    const float want = std::exp(x), got = kite::exp_approx(x);
    const double ulp = std::nextafter(want, INFINITY) - want;
    if (std::abs(static_cast<double>(got) - want) / ulp > worst) worst = std::abs(static_cast<double>(got) - want) / ulp, worst_x = x;
  }
  MESSAGE(n, " points, worst ", worst, " ulp at ", worst_x);
  CHECK(worst <= 1.0);
  CHECK(kite::exp_approx(0.f) == 1.f);
  CHECK(kite::exp_approx(-87.34f) == 0.f);
  CHECK(kite::exp_approx(-1e30f) == 0.f);
  CHECK(kite::exp_approx(-INFINITY) == 0.f);
  CHECK(kite::exp_approx(1000.f) == kite::exp_approx(88.3f));
  CHECK(std::isfinite(kite::exp_approx(88.3f)));
  CHECK(kite::exp_masked(2.f, 1.f, 0.5f) == kite::exp_approx(0.5f));
  CHECK(kite::exp_masked(-INFINITY, 1.f, 1.f) == 0.f);
  CHECK(kite::exp_masked(std::numeric_limits<float>::quiet_NaN(), 1.f, 1.f) == 0.f);
  CHECK(kite::exp_masked(-std::numeric_limits<float>::quiet_NaN(), 1.f, 1.f) == 0.f);
}
