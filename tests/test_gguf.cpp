#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <limits>

#include "formats/gguf.h"
#include "tests/testdata.h"

using namespace kite;
using namespace kite::test;

namespace {

// Builds GGUF images byte by byte, so tests can make exactly the broken file they want.
struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  Bytes& pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& str(std::string_view s) {
    pod<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return pod<uint32_t>(0x46554747).pod<uint32_t>(version).pod<uint64_t>(n_tensors).pod<uint64_t>(n_kv);
  }
  Bytes& kv_u32(std::string_view key, uint32_t v) { return str(key).pod<uint32_t>(4).pod<uint32_t>(v); }
  Bytes& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).pod<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) pod<uint64_t>(d);
    return pod<uint32_t>(type).pod<uint64_t>(offset);
  }
  Bytes& pad(size_t align = 32) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

std::string parse_error(const Bytes& x) {
  auto r = gguf::File::parse_bytes(x.b.data(), x.b.size(), "test.gguf");
  REQUIRE_MESSAGE(!r.ok(), "expected a parse error");
  CHECK_MESSAGE(r.error().message.rfind("test.gguf: ", 0) == 0, r.error().message);
  return r.error().message;
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

}  // namespace

TEST_CASE("gguf: reads every test file with typed getters") {
  auto f = gguf::File::open(testdata("gguf/llama-draft-f16.gguf"));
  REQUIRE_MESSAGE(f.ok(), (f.ok() ? std::string() : f.error().message));
  CHECK(f->version() == 3);
  const auto& m = f->metadata();
  CHECK(*m.get<std::string>("general.architecture") == "llama");
  CHECK(*m.get<uint32_t>("llama.block_count") == 2);
  CHECK(*m.get<uint32_t>("llama.embedding_length") == 256);
  CHECK(m.get_array<std::string>("tokenizer.ggml.tokens")->size() == 4096);
  CHECK(*m.get_int("llama.block_count") == 2);

  auto missing = m.get<uint32_t>("llama.no_such_key");
  REQUIRE_FALSE(missing.ok());
  CHECK(contains(missing.error().message, "missing key 'llama.no_such_key'"));
  CHECK(contains(missing.error().message, "llama-draft-f16.gguf"));
  auto wrong = m.get<std::string>("llama.block_count");
  REQUIRE_FALSE(wrong.ok());
  CHECK(contains(wrong.error().message, "has type u32, expected string"));
  auto wrong_arr = m.get_array<int32_t>("tokenizer.ggml.tokens");
  REQUIRE_FALSE(wrong_arr.ok());
  CHECK(contains(wrong_arr.error().message, "array of string"));

  const auto* emb = f->find_tensor("token_embd.weight");
  REQUIRE(emb != nullptr);
  CHECK(emb->type == quant::Type::F16);
  CHECK(emb->ne == std::vector<int64_t>{256, 4096});
  CHECK(emb->nbytes == 256 * 4096 * 2);
  CHECK(emb->data != nullptr);
  CHECK(f->find_tensor("nope") == nullptr);

  for (const auto& dir : {"gguf", "vocab"})
    for (const auto& path : testdata_files(dir, ".gguf")) {
      auto g = gguf::File::open(path);
      CHECK_MESSAGE(g.ok(), path, ": ", g.ok() ? "" : g.error().message);
    }
}

TEST_CASE("gguf: read and write back is byte-identical for every test file") {
  const auto dir = scratch_dir("gguf-roundtrip");
  int n = 0;
  for (const auto& sub : {"gguf", "vocab"})
    for (const auto& path : testdata_files(sub, ".gguf")) {
      auto f = gguf::File::open(path);
      REQUIRE_MESSAGE(f.ok(), (f.ok() ? std::string() : f.error().message));
      const std::string out = (dir / std::filesystem::path(path).filename()).string();
      auto st = gguf::rewrite(*f, out);
      REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.error().message));
      CHECK_MESSAGE(read_file(out) == read_file(path), "rewrite differs: ", path);
      std::filesystem::remove(out);
      ++n;
    }
  CHECK(n >= 30);
  // No temp files left behind.
  CHECK(std::filesystem::is_empty(dir));
}

TEST_CASE("gguf: writer builds a file the reader reads back") {
  const auto dir = scratch_dir("gguf-writer");
  const std::string path = (dir / "w.gguf").string();
  gguf::Writer w;
  w.metadata().set("general.architecture", "test");
  w.metadata().set("general.alignment", uint32_t{64});
  w.metadata().set("x.f", 1.5f);
  w.metadata().set("x.flag", true);
  gguf::Array arr{gguf::ValueType::STRING, {gguf::Value("a"), gguf::Value("bc")}};
  w.metadata().set("x.strings", arr);
  gguf::Array nested{gguf::ValueType::ARRAY, {gguf::Value(gguf::Array{gguf::ValueType::I32, {gguf::Value(int32_t{-3})}})}};
  w.metadata().set("x.nested", nested);
  REQUIRE(w.add_tensor("a", quant::Type::F32, {3, 2}).ok());
  REQUIRE(w.add_tensor("b", quant::Type::Q8_0, {64}).ok());
  CHECK_FALSE(w.add_tensor("a", quant::Type::F32, {1}).ok());   // duplicate
  CHECK_FALSE(w.add_tensor("c", quant::Type::Q4_0, {33}).ok()); // partial block
  REQUIRE(w.begin(path).ok());
  CHECK_FALSE(std::filesystem::exists(path));  // not visible until finish()
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  CHECK_FALSE(w.write_tensor_data(a.data(), 8).ok());  // wrong size
  REQUIRE(w.write_tensor_data(a.data(), 24).ok());
  std::vector<uint8_t> b(68, 7);
  REQUIRE(w.write_tensor_data(b.data(), b.size()).ok());
  REQUIRE(w.finish().ok());

  auto f = gguf::File::open(path);
  REQUIRE_MESSAGE(f.ok(), (f.ok() ? std::string() : f.error().message));
  CHECK(f->alignment() == 64);
  CHECK(f->data_offset() % 64 == 0);
  CHECK(*f->metadata().get<float>("x.f") == 1.5f);
  CHECK(*f->metadata().get<bool>("x.flag"));
  CHECK(*f->metadata().get_array<std::string>("x.strings") == std::vector<std::string>{"a", "bc"});
  const auto* inner = f->metadata().find("x.nested")->get_if<gguf::Array>()->items[0].get_if<gguf::Array>();
  REQUIRE(inner != nullptr);
  CHECK(*inner->items[0].get_if<int32_t>() == -3);
  const auto* ta = f->find_tensor("a");
  REQUIRE(ta != nullptr);
  CHECK(std::memcmp(ta->data, a.data(), 24) == 0);
  CHECK(f->find_tensor("b")->offset == 64);
  CHECK(f->find_tensor("b")->data[67] == 7);
}

TEST_CASE("gguf: an unfinished writer leaves nothing behind") {
  const auto dir = scratch_dir("gguf-unfinished");
  const std::string path = (dir / "u.gguf").string();
  {
    gguf::Writer w;
    REQUIRE(w.add_tensor("a", quant::Type::F32, {4}).ok());
    REQUIRE(w.begin(path).ok());
    CHECK_FALSE(w.finish().ok());  // tensor data missing
  }
  CHECK(std::filesystem::is_empty(dir));
}

TEST_CASE("gguf: bad input gets an error naming the problem") {
  SUBCASE("empty and truncated") {
    CHECK(contains(parse_error(Bytes{}), "truncated"));
    Bytes ok;
    ok.header(1, 1).kv_u32("general.alignment", 32).tensor("t", {8}, 0, 0).pad().zeros(32);
    REQUIRE(gguf::File::parse_bytes(ok.b.data(), ok.b.size(), "ok").ok());
    // every proper prefix of a valid file fails cleanly
    for (size_t n = 0; n + 1 < ok.b.size(); ++n) {
      Bytes cut;
      cut.b.assign(ok.b.begin(), ok.b.begin() + static_cast<ptrdiff_t>(n));
      parse_error(cut);
    }
  }
  SUBCASE("magic and version") {
    Bytes m;
    m.pod<uint32_t>(0x12345678).pod<uint32_t>(3).pod<uint64_t>(0).pod<uint64_t>(0);
    CHECK(contains(parse_error(m), "not a GGUF file"));
    Bytes v;
    v.header(0, 0, 7);
    CHECK(contains(parse_error(v), "unknown GGUF version 7"));
    Bytes v1;
    v1.header(0, 0, 1);
    CHECK(contains(parse_error(v1), "version 1 is not supported"));
    Bytes be;
    be.header(0, 0, 0x03000000);
    CHECK(contains(parse_error(be), "big-endian"));
  }
  SUBCASE("absurd counts and lengths") {
    Bytes t;
    t.header(uint64_t{1} << 63, 0);
    CHECK(contains(parse_error(t), "tensor count"));
    Bytes k;
    k.header(0, ~uint64_t{0});
    CHECK(contains(parse_error(k), "metadata count"));
    Bytes s;
    s.header(0, 1).pod<uint64_t>(uint64_t{1} << 63).zeros(16);
    CHECK(contains(parse_error(s), "past the end"));
    Bytes a;
    a.header(0, 1).str("arr").pod<uint32_t>(9).pod<uint32_t>(4).pod<uint64_t>(uint64_t{1} << 62);
    CHECK(contains(parse_error(a), "array length"));
    Bytes deep;
    deep.header(0, 1).str("deep").pod<uint32_t>(9);
    for (int i = 0; i < 20; ++i) deep.pod<uint32_t>(9).pod<uint64_t>(1);
    CHECK(contains(parse_error(deep), "nested deeper"));
  }
  SUBCASE("unknown types") {
    Bytes vt;
    vt.header(0, 1).str("k").pod<uint32_t>(13).pod<uint32_t>(0);
    CHECK(contains(parse_error(vt), "unknown value type 13"));
    Bytes tt;
    tt.header(1, 0).tensor("t", {8}, 4, 0).pad().zeros(32);
    CHECK(contains(parse_error(tt), "unknown type id 4"));
    Bytes bb;
    bb.header(0, 1).str("b").pod<uint32_t>(7).pod<uint8_t>(2);
    CHECK(contains(parse_error(bb), "not 0 or 1"));
  }
  SUBCASE("keys and names") {
    Bytes dup;
    dup.header(0, 2).kv_u32("a", 1).kv_u32("a", 2);
    CHECK(contains(parse_error(dup), "duplicate metadata key 'a'"));
    Bytes utf;
    utf.header(0, 1).kv_u32("bad\xff", 1);
    CHECK(contains(parse_error(utf), "not valid UTF-8"));
    Bytes empty_key;
    empty_key.header(0, 1).kv_u32("", 1);
    CHECK(contains(parse_error(empty_key), "empty metadata key"));
    Bytes dupt;
    dupt.header(2, 0).tensor("t", {8}, 0, 0).tensor("t", {8}, 0, 32).pad().zeros(64);
    CHECK(contains(parse_error(dupt), "duplicate tensor name 't'"));
    Bytes align;
    align.header(0, 1).kv_u32("general.alignment", 24);
    CHECK(contains(parse_error(align), "not a power of two"));
    Bytes align_t;
    align_t.header(0, 1).str("general.alignment").pod<uint32_t>(8).str("x");
    CHECK(contains(parse_error(align_t), "expected u32"));
  }
  SUBCASE("tensor shapes, offsets and sizes") {
    Bytes dims;
    dims.header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0);
    CHECK(contains(parse_error(dims), "5 dimensions"));
    Bytes neg;
    neg.header(1, 0).tensor("t", {~uint64_t{0}}, 0, 0);
    CHECK(contains(parse_error(neg), "negative or too large"));
    Bytes ovf;
    ovf.header(1, 0).tensor("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0);
    CHECK(contains(parse_error(ovf), "64 bits"));
    Bytes blk;
    blk.header(1, 0).tensor("t", {33}, 2, 0);
    CHECK(contains(parse_error(blk), "not a multiple"));
    Bytes past;
    past.header(1, 0).tensor("t", {8}, 0, 64).pad().zeros(32);
    CHECK(contains(parse_error(past), "past the end of the data section"));
    Bytes big;
    big.header(1, 0).tensor("t", {uint64_t{1} << 40}, 0, 0).pad().zeros(32);
    CHECK(contains(parse_error(big), "past the end"));
    Bytes mis;
    mis.header(1, 0).tensor("t", {8}, 0, 3).pad().zeros(64);
    CHECK(contains(parse_error(mis), "not a multiple of the alignment"));
    Bytes unaligned;  // alignment 1 lets a tensor start at an odd byte: refused, kernels read halves in place
    unaligned.header(1, 1).kv_u32("general.alignment", 1).tensor("t", {32}, 8, 0).zeros(34);
    CHECK(contains(parse_error(unaligned), "aligned"));
    Bytes overlap;
    overlap.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(96);
    CHECK(contains(parse_error(overlap), "overlap"));
  }
}

TEST_CASE("gguf: tensor infos in any order") {
  Bytes x;
  x.header(2, 0).tensor("second", {8}, 0, 32).tensor("first", {8}, 0, 0).pad().zeros(64);
  x.b[x.b.size() - 64] = 1;  // first byte of "first"
  auto f = gguf::File::parse_bytes(x.b.data(), x.b.size(), "order.gguf");
  REQUIRE_MESSAGE(f.ok(), (f.ok() ? std::string() : f.error().message));
  CHECK(f->tensors()[0].name == "second");
  CHECK(f->find_tensor("first")->data[0] == 1);
  CHECK(f->find_tensor("second")->data[0] == 0);
}
