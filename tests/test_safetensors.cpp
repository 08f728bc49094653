// safetensors reader: the testdata checkpoints, hand-built files, every kind of bad header,
// sharded checkpoints, and the fuzzer's regression inputs.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "src/base/utf8.h"
#include "src/base/half.h"
#include "tests/testdata.h"

namespace st = kite::safetensors;
using kite::quant::Type;

namespace {

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file image: length + header + data.
std::string image(const std::string& header, const std::string& data = {}) {
  return le64(header.size()) + header + data;
}

kite::Result<st::File> parse(const std::string& bytes) {
  return st::File::parse_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "t.safetensors");
}

void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

// Expects a parse error whose message contains the file name and `what`.
void expect_error(const std::string& bytes, const std::string& what) {
  auto r = parse(bytes);
  REQUIRE_MESSAGE(!r.ok(), "expected an error containing: ", what);
  const std::string& msg = r.error().message;
  CHECK_MESSAGE(msg.find("t.safetensors") != std::string::npos, msg);
  CHECK_MESSAGE(kite::valid_utf8(msg), "message is not UTF-8: ", st::printable(msg));
  CHECK_MESSAGE(msg.find(what) != std::string::npos, "got: ", msg, "\nexpected to contain: ", what);
}

const std::string kOneTensor = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

}  // namespace

TEST_CASE("safetensors: reads the testdata checkpoints") {
  struct Expect {
    const char* model;
    const char* dtype;
    int64_t n_embd, n_ff, n_layers, kv_dim;
    size_t n_tensors;
  };
  const Expect models[] = {
      {"llama-draft", "BF16", 256, 768, 2, 64, 1 + 1 + 2 * 9},
      {"llama-target", "BF16", 512, 1536, 4, 128, 1 + 1 + 1 + 4 * 9},
      {"qwen2-tiny", "F16", 256, 768, 2, 128, 1 + 1 + 2 * 12},
      {"qwen3-tiny", "BF16", 256, 768, 2, 128, 1 + 1 + 2 * 11},
  };
  for (const auto& m : models) {
    CAPTURE(m.model);
    const std::string path = kite::test::testdata(std::string("models/") + m.model + "/model.safetensors");
    auto f = st::File::open(path);
    REQUIRE_MESSAGE(f.ok(), (f.ok() ? std::string() : f.error().message));
    CHECK(f->path() == path);
    CHECK(f->tensors().size() == m.n_tensors);
    CHECK(f->file_size() == std::filesystem::file_size(path));

    const st::Tensor* emb = f->find_tensor("model.embed_tokens.weight");
    REQUIRE(emb != nullptr);
    CHECK(emb->dtype == m.dtype);
    CHECK(emb->shape == std::vector<int64_t>{4096, m.n_embd});
    CHECK(emb->ne == std::vector<int64_t>{m.n_embd, 4096});
    const st::Tensor* down = f->find_tensor("model.layers.0.mlp.down_proj.weight");
    REQUIRE(down != nullptr);
    CHECK(down->ne == std::vector<int64_t>{m.n_ff, m.n_embd});
    const st::Tensor* k = f->find_tensor("model.layers.1.self_attn.k_proj.weight");
    REQUIRE(k != nullptr);
    CHECK(k->ne == std::vector<int64_t>{m.n_embd, m.kv_dim});
    const st::Tensor* norm = f->find_tensor("model.norm.weight");
    REQUIRE(norm != nullptr);
    CHECK(norm->ne == std::vector<int64_t>{m.n_embd});
    CHECK(f->find_tensor("no.such.tensor") == nullptr);

    // Tensors are sorted by offset, tile the data section and stay inside the file.
    uint64_t expect_offset = 0;
    for (const auto& t : f->tensors()) {
      CAPTURE(t.name);
      CHECK(t.offset == expect_offset);
      expect_offset = t.offset + t.nbytes;
      CHECK(t.nbytes == static_cast<uint64_t>(t.n_elements()) * 2);
      CHECK(t.data == emb->data - emb->offset + t.offset);
      CHECK(f->data_offset() + t.offset + t.nbytes <= f->file_size());
    }
    CHECK(f->data_offset() + expect_offset == f->file_size());
    // RMS norm weights of a trained model are positive and O(1): decode a few as a sanity check.
    const auto* raw = reinterpret_cast<const uint16_t*>(norm->data);
    for (int i = 0; i < 8; ++i) {
      const float v = norm->type == Type::BF16 ? kite::bf16_to_fp32(raw[i]) : kite::fp16_to_fp32(raw[i]);
      CHECK(v > 0.0f);
      CHECK(v < 10.0f);
    }
  }
}

TEST_CASE("safetensors: hand-built file with every supported dtype") {
  std::string data;
  auto put_f32 = [&](float x) { data.append(reinterpret_cast<const char*>(&x), 4); };
  for (float x : {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}) put_f32(x);  // f32 [2,3] at 0..24
  const uint16_t h = kite::fp32_to_fp16(0.5f), b = kite::fp32_to_bf16(-2.0f);
  data.append(reinterpret_cast<const char*>(&h), 2);  // f16 scalar at 24..26
  data.append(reinterpret_cast<const char*>(&b), 2);  // bf16 [1] at 26..28
  data += std::string("\x01\x02\x03\x04", 4);         // u8 [2,2] at 28..32
  data += std::string(16, '\x07');                    // i64 [2] at 32..48
  data += std::string(16, '\x00');                    // empty + [1,1,1,2] i64 at 48..64
  const std::string header = R"({
    "__metadata__": {"format": "pt", "note": "héllo"},
    "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "s": {"dtype": "F16", "shape": [], "data_offsets": [24, 26]},
    "b": {"dtype": "BF16", "shape": [1], "data_offsets": [26, 28]},
    "u": {"dtype": "U8", "shape": [2, 2], "data_offsets": [28, 32]},
    "i": {"dtype": "I64", "shape": [2], "data_offsets": [32, 48]},
    "e": {"dtype": "BOOL", "shape": [0, 5], "data_offsets": [48, 48]},
    "d": {"dtype": "U64", "shape": [1, 1, 1, 2], "data_offsets": [48, 64]},
    "zé": {"dtype": "I32", "shape": [0], "data_offsets": [64, 64]}
  }   )";
  auto f = parse(image(header, data));
  REQUIRE_MESSAGE(f.ok(), (f.ok() ? std::string() : f.error().message));
  CHECK(f->metadata().at("format") == "pt");
  CHECK(f->metadata().at("note") == "héllo");
  REQUIRE(f->tensors().size() == 8);

  const st::Tensor* w = f->find_tensor("w");
  REQUIRE(w != nullptr);
  CHECK(w->type == Type::F32);
  CHECK(w->ne == std::vector<int64_t>{3, 2});
  float row1[3];
  std::memcpy(row1, w->data + 12, 12);
  CHECK(row1[0] == 4.0f);
  CHECK(row1[2] == 6.0f);
  const auto info = w->info();
  CHECK(info.name == "w");
  CHECK(info.ne == w->ne);
  CHECK(info.data == w->data);
  CHECK(info.nbytes == 24);

  const st::Tensor* s = f->find_tensor("s");
  CHECK(s->ne == std::vector<int64_t>{1});
  CHECK(s->shape.empty());
  CHECK(kite::fp16_to_fp32(*reinterpret_cast<const uint16_t*>(s->data)) == 0.5f);
  CHECK(f->find_tensor("b")->type == Type::BF16);
  CHECK(f->find_tensor("u")->type == Type::I8);
  CHECK(f->find_tensor("u")->dtype == "U8");
  CHECK(f->find_tensor("u")->data[3] == 4);
  CHECK(f->find_tensor("i")->type == Type::I64);
  CHECK(f->find_tensor("e")->ne == std::vector<int64_t>{5, 0});
  CHECK(f->find_tensor("e")->n_elements() == 0);
  CHECK(f->find_tensor("d")->ne == std::vector<int64_t>{2, 1, 1, 1});
  CHECK(f->find_tensor("d")->type == Type::I64);
  CHECK(f->find_tensor("zé") != nullptr);

  CHECK(st::dtype_to_type("BF16").value() == Type::BF16);
  CHECK(st::dtype_to_type("U16").value() == Type::I16);
  CHECK(st::dtype_to_type("F64").value() == Type::F64);
  CHECK(!st::dtype_to_type("F8_E4M3").ok());
  CHECK(!st::dtype_to_type("Q4").ok());
}

TEST_CASE("safetensors: bad headers are errors that say what is wrong") {
  expect_error("", "too short");
  expect_error(std::string("\x05\x00\x00", 3), "too short");
  expect_error(le64(uint64_t{1} << 63) + "{}", "header length 9223372036854775808 runs past the end");
  expect_error(le64(~uint64_t{0}) + "{}", "runs past the end");
  expect_error(le64(100) + "{}", "runs past the end");
  expect_error(image("{"), "too short");
  expect_error(image("{\"a\":"), "malformed JSON");
  expect_error(image("[1,2,3]"), "does not start with '{'");
  expect_error(image("{\"a\": 1} x"), "malformed JSON");
  expect_error(image(R"({"a": [1]})"), "entry must be an object");
  expect_error(image(R"({"a": {"shape":[1],"data_offsets":[0,4]}})", std::string(4, 0)), "'dtype'");
  expect_error(image(R"({"a": {"dtype":7,"shape":[1],"data_offsets":[0,4]}})", std::string(4, 0)), "'dtype'");
  expect_error(image(R"({"a": {"dtype":"F32","data_offsets":[0,4]}})", std::string(4, 0)), "'shape'");
  expect_error(image(R"({"a": {"dtype":"F32","shape":"1","data_offsets":[0,4]}})", std::string(4, 0)), "'shape'");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[1]}})", std::string(4, 0)), "data_offsets");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[1],"data_offsets":[0]}})", std::string(4, 0)), "data_offsets");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", std::string(4, 0)),
               "data_offsets[1] must be a non-negative integer");
  expect_error(image(R"({"a": {"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", std::string(4, 0)),
               "unknown dtype 'F99'");
  expect_error(image(R"({"a": {"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", std::string(4, 0)),
               "F8_E4M3 is not supported");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, 0)),
               "shape[0] is negative");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", std::string(4, 0)),
               "shape[0] must be a non-negative integer");
  expect_error(
      image(R"({"a": {"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", std::string(4, 0)),
      "overflows");
  expect_error(
      image(R"({"a": {"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", std::string(4, 0)),
      "too large");
  expect_error(image(R"({"a": {"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,4]}})", std::string(4, 0)),
               "overflows");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[1,1,1,1,1],"data_offsets":[0,4]}})", std::string(4, 0)),
               "5 dimensions");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[1],"data_offsets":[0,4]}})"), "run past the data section");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", std::string(4, 0)), "reversed");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})"),
               "run past the data section");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", std::string(8, 0)),
               "hold 4 bytes but shape x F32 needs 8");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                         "b": {"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                     std::string(8, 0)),
               "overlap");
  expect_error(image(R"({"a": {"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                         "a": {"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                     std::string(8, 0)),
               "duplicate key 'a'");
  expect_error(image("{\"\xff\xfe\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, 0)),
               "malformed JSON");
  expect_error(image(R"({"": {"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, 0)), "empty name");
  expect_error(image(R"({"__metadata__": {"a": 1}})"), "__metadata__ key 'a' must be a string");
  expect_error(image(R"({"__metadata__": []})"), "__metadata__ must be an object");
  expect_error(image(std::string(100, '{') + std::string(100, '}')), "malformed JSON");
  std::string deep = "{\"a\":" + std::string(1000, '[') + std::string(1000, ']') + "}";
  expect_error(image(deep), "nests deeper");

  // A valid file still parses after all that.
  CHECK(parse(image(kOneTensor, std::string(8, 0))).ok());
  // An empty object is a valid (empty) checkpoint.
  auto empty = parse(image("{}"));
  REQUIRE(empty.ok());
  CHECK(empty->tensors().empty());
}

TEST_CASE("safetensors: sharded checkpoints through model.safetensors.index.json") {
  const auto dir = kite::test::scratch_dir("safetensors-shards");
  const std::string shard1 = image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                                       "b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})",
                                   std::string(16, '\x01'));
  const std::string shard2 = image(R"({"c":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}})", std::string(6, '\x02'));
  write_file(dir / "model-00001-of-00002.safetensors", shard1);
  write_file(dir / "model-00002-of-00002.safetensors", shard2);
  const std::string good_index = R"({"metadata": {"total_size": 22}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})";
  write_file(dir / "model.safetensors.index.json", good_index);

  auto ck = st::Checkpoint::open(dir.string());
  REQUIRE_MESSAGE(ck.ok(), (ck.ok() ? std::string() : ck.error().message));
  CHECK(ck->shards().size() == 2);
  REQUIRE(ck->tensors().size() == 3);
  REQUIRE(ck->find_tensor("c") != nullptr);
  CHECK(ck->find_tensor("c")->data[0] == 2);
  CHECK(ck->find_tensor("b")->ne == std::vector<int64_t>{2, 2});
  CHECK(ck->find_tensor("a")->data[7] == 1);

  auto open_index = [&](const std::string& text) { return st::Checkpoint::open_index(text, dir.string(), "idx.json"); };
  auto expect_index_error = [&](const std::string& text, const std::string& what) {
    auto r = open_index(text);
    REQUIRE_MESSAGE(!r.ok(), what);
    CHECK_MESSAGE(r.error().message.find("idx.json") != std::string::npos, r.error().message);
    CHECK_MESSAGE(r.error().message.find(what) != std::string::npos, r.error().message, " / ", what);
  };
  expect_index_error("{", "malformed JSON");
  expect_index_error("[]", "not an object");
  expect_index_error(R"({"weight_map": []})", "'weight_map'");
  expect_index_error(R"({"weight_map": {}})", "lists no tensors");
  expect_index_error(R"({"weight_map": {"a": 3}})", "must be a string");
  expect_index_error(R"({"weight_map": {"a": "missing.safetensors"}})", "missing.safetensors");
  expect_index_error(R"({"weight_map": {"a": "../x.safetensors"}})", "leaves the checkpoint folder");
  expect_index_error(R"({"weight_map": {"a": "/etc/passwd"}})", "absolute path");
  expect_index_error(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
      "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors",
      "d": "model-00002-of-00002.safetensors"}})",
                     "tensor 'd' is listed in shard 'model-00002-of-00002.safetensors' but not in it");
  expect_index_error(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})",
                     "tensor 'b' of shard 'model-00001-of-00002.safetensors' is not in the weight_map");

  // The same tensor in two shards.
  write_file(dir / "dup.safetensors", image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                                                "x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                            std::string(8, 0)));
  expect_index_error(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
      "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors", "x": "dup.safetensors"}})",
                     "tensor 'a' is in two shards");
  // A broken shard names the shard and what is wrong inside it.
  write_file(dir / "bad.safetensors", le64(1000) + "{}");
  expect_index_error(R"({"weight_map": {"a": "bad.safetensors"}})", "bad.safetensors");

  // Folder without checkpoint files.
  const auto empty = kite::test::scratch_dir("safetensors-empty");
  auto none = st::Checkpoint::open(empty.string());
  REQUIRE(!none.ok());
  CHECK(none.error().message.find("no model.safetensors") != std::string::npos);
  // A single file and a folder with model.safetensors.
  auto single = st::Checkpoint::open(kite::test::testdata("models/qwen2-tiny"));
  REQUIRE_MESSAGE(single.ok(), (single.ok() ? std::string() : single.error().message));
  CHECK(single->shards().size() == 1);
  CHECK(single->tensors().size() == 26);
}

TEST_CASE("safetensors: fuzzer regression inputs end in a File or an Error") {
  const std::filesystem::path dir = std::filesystem::path(KITE_SOURCE_DIR) / "tests/fuzz/regressions/safetensors";
  REQUIRE(std::filesystem::is_directory(dir));
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename().string()[0] == '.') continue;
    const std::string bytes = kite::test::read_file(e.path().string());
    auto r = parse(bytes);
    if (r.ok()) {
      for (const auto& t : r->tensors()) CHECK(t.offset + t.nbytes <= r->file_size() - r->data_offset());
    } else {
      CHECK(!r.error().message.empty());
    }
    ++n;
  }
  MESSAGE(n, " regression inputs");
}

TEST_CASE("safetensors: UTF-8 validation") {
  CHECK(kite::valid_utf8("plain"));
  CHECK(kite::valid_utf8("h\xc3\xa9llo \xe2\x96\x81 \xf0\x9f\x98\x80"));
  CHECK(!kite::valid_utf8("\xc0\xaf"));          // overlong
  CHECK(!kite::valid_utf8("\xed\xa0\x80"));      // surrogate
  CHECK(!kite::valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  CHECK(!kite::valid_utf8("\xe2\x96"));          // truncated
  CHECK(!kite::valid_utf8("\x80"));
  CHECK(st::printable("a\xff"
                      "z\n\xc3\xa9") == "a\\xffz\\x0a\xc3\xa9");
  CHECK(st::printable("abcdef", 3) == "abc...");
  CHECK(st::printable("\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81", 4) == "\xe2\x96\x81\xe2\x96\x81...");
}
