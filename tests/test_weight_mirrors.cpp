// src/core/weight_mirrors.h on its own (the GPU backends use it; test_vulkan.cpp checks it
// through real contexts): one copy per host weight whatever the number of holders, freed with
// the last one, and a larger request at the same address never served by a smaller copy.
#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "src/core/weight_mirrors.h"

using namespace kite;

namespace {

// A "device copy" that counts the copies alive.
struct Copy {
  explicit Copy(int* alive) : alive_(alive) { ++*alive_; }
  ~Copy() { --*alive_; }
  int* alive_;
};

}  // namespace

TEST_CASE("core: weight mirrors are shared by holders, freed with the last, never too small") {
  int alive = 0, uploads = 0;
  WeightMirrors<std::unique_ptr<Copy>> m;
  auto upload = [&](size_t) -> Result<std::unique_ptr<Copy>> {
    ++uploads;
    return std::make_unique<Copy>(&alive);
  };
  const char host[64] = {};
  MirrorHolds a, b;
  bool first = false;
  auto c1 = m.acquire(host, 32, a, upload, &first);
  REQUIRE(c1.ok());
  CHECK(first);
  auto c2 = m.acquire(host, 32, a, upload, &first);  // the same holder again: no new hold
  REQUIRE(c2.ok());
  CHECK_FALSE(first);
  CHECK(*c1 == *c2);
  auto c3 = m.acquire(host, 16, b, upload, &first);  // a smaller view: served by the same copy
  REQUIRE(c3.ok());
  CHECK(first);
  CHECK(*c3 == *c1);
  CHECK(uploads == 1);
  CHECK(m.bytes() == 32);
  auto c4 = m.acquire(host, 64, b, upload);  // larger than the copy: a copy of its own
  REQUIRE(c4.ok());
  CHECK(*c4 != *c1);
  CHECK(uploads == 2);
  CHECK(m.bytes() == 96);
  CHECK(m.has(host, 48));
  CHECK_FALSE(m.has(host + 1, 8));
  m.release(a);  // b still holds both copies
  CHECK(a.empty());
  CHECK(alive == 2);
  m.release(b);
  CHECK(alive == 0);
  CHECK(m.bytes() == 0);
  CHECK_FALSE(m.has(host, 1));
  // A failed upload is the caller's error and leaves nothing behind.
  auto failing = [](size_t) -> Result<std::unique_ptr<Copy>> { return make_error("out of device memory"); };
  auto bad = m.acquire(host, 8, a, failing);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == "out of device memory");
  CHECK(a.empty());
  CHECK(m.bytes() == 0);
}
