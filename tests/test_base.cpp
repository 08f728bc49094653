#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

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
