// `kite inspect` end to end, on every test file and folder, and on every fuzz regression input;
// `kite devices` against the backends' own device lists.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "src/core/backend.h"
#include "src/core/devices.h"
#include "tests/process.h"

using namespace kite::test;

namespace {

std::vector<std::string> regression_inputs(const std::string& format) {
  std::vector<std::string> out;
  const auto dir = std::filesystem::path(KITE_SOURCE_DIR) / "tests/fuzz/regressions" / format;
  REQUIRE(std::filesystem::is_directory(dir));
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string()[0] != '.') out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("inspect: every GGUF test file, text and --json") {
  for (const auto& dir : {"gguf", "vocab"})
    for (const auto& path : testdata_files(dir, ".gguf")) {
      auto text = run_kite({"inspect", path});
      CHECK_MESSAGE(text.exit_code == 0, path, ": ", text.err);
      CHECK(text.out.find("format:        GGUF v") != std::string::npos);
      auto js = run_kite({"inspect", "--json", path});
      REQUIRE_MESSAGE(js.exit_code == 0, path, ": ", js.err);
      auto doc = nlohmann::json::parse(js.out);
      auto f = kite::gguf::File::open(path);
      REQUIRE(f.ok());
      CHECK(doc["tensors"].size() == f->tensors().size());
      CHECK(doc["metadata"].size() == f->metadata().size());
      if (!f->tensors().empty()) CHECK(doc["tensors"][0]["name"] == f->tensors()[0].name);
    }
  auto d = run_kite({"inspect", "--json", testdata("gguf/llama-draft-Q4_K_M.gguf")});
  auto doc = nlohmann::json::parse(d.out);
  CHECK(doc["architecture"] == "llama");
  CHECK(doc["hyperparameters"]["block_count"] == 2);
  CHECK(doc["tokenizer"]["tokens"] == 4096);
  CHECK(doc["tokenizer"]["pre"] == "llama-bpe");
}

TEST_CASE("inspect: every Hugging Face test folder and safetensors file") {
  for (const auto& model : {"llama-target", "llama-draft", "qwen2-tiny", "qwen3-tiny"}) {
    const std::string dir = testdata(std::string("models/") + model);
    auto js = run_kite({"inspect", "--json", dir});
    REQUIRE_MESSAGE(js.exit_code == 0, dir, ": ", js.err);
    auto doc = nlohmann::json::parse(js.out);
    CHECK(doc["format"] == "safetensors");
    CHECK(!doc["architecture"].get<std::string>().empty());
    CHECK(doc["tensors"].size() > 10);
    auto text = run_kite({"inspect", dir});
    CHECK(text.exit_code == 0);
    auto file = run_kite({"inspect", "--json", dir + "/model.safetensors"});
    REQUIRE_MESSAGE(file.exit_code == 0, file.err);
    auto st = kite::safetensors::File::open(dir + "/model.safetensors");
    REQUIRE(st.ok());
    CHECK(nlohmann::json::parse(file.out)["tensors"].size() == st->tensors().size());
  }
}

TEST_CASE("inspect: bad files and arguments fail cleanly") {
  auto missing = run_kite({"inspect", "/nonexistent/model.gguf"});
  CHECK(missing.exit_code == 1);
  CHECK(missing.err.find("/nonexistent/model.gguf") != std::string::npos);
  CHECK(missing.out.empty());
  auto not_gguf = run_kite({"inspect", testdata("models/llama-draft/config.json")});
  CHECK(not_gguf.exit_code == 1);
  CHECK(not_gguf.err.find("not a GGUF file") != std::string::npos);
  auto no_arg = run_kite({"inspect"});
  CHECK(no_arg.exit_code == 2);
  auto bad_flag = run_kite({"inspect", "--no-such-flag", "x"});
  CHECK(bad_flag.exit_code == 2);
}

TEST_CASE("fuzz regressions: every saved input fails cleanly in the reader and in kite inspect") {
  for (const auto& format : {"gguf", "safetensors"}) {
    for (const auto& path : regression_inputs(format)) {
      const std::string bytes = read_file(path);
      const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
      if (std::string(format) == "gguf")
        CHECK_FALSE(kite::gguf::File::parse_bytes(data, bytes.size(), path).ok());
      else
        CHECK_FALSE(kite::safetensors::File::parse_bytes(data, bytes.size(), path).ok());
      // inspect picks the reader by name; give safetensors inputs their extension
      std::string input = path;
      if (std::string(format) == "safetensors") {
        input = (scratch_dir("fuzz-st") / "input.safetensors").string();
        std::filesystem::copy_file(path, input, std::filesystem::copy_options::overwrite_existing);
      }
      auto r = run_kite({"inspect", input});
      CHECK_MESSAGE(r.exit_code == 1, path, " exit ", r.exit_code, ": ", r.err);
      CHECK_MESSAGE(!r.err.empty(), path);
    }
  }
}

TEST_CASE("devices: kite devices lists every compiled-in backend's devices, or why it has none") {
  auto js = run_kite({"devices", "--json"});
  REQUIRE_MESSAGE(js.exit_code == 0, js.err);
  const auto doc = nlohmann::json::parse(js.out);
  const std::vector<std::string> backends = kite::backend_names();
  REQUIRE(doc.size() == backends.size());
  for (size_t b = 0; b < backends.size(); ++b) {
    const auto& entry = doc[b];
    INFO(entry.dump());
    CHECK(entry["backend"] == backends[b]);
    // The same devices (or the same reason for none) as the backend lists in this process.
    auto want = kite::list_devices(backends[b]);
    if (!want.ok()) {
      CHECK(entry["devices"].empty());
      CHECK(entry["error"] == want.error().message);
      continue;
    }
    REQUIRE(entry["devices"].size() == want->size());
    for (size_t i = 0; i < want->size(); ++i) {
      const auto& d = entry["devices"][i];
      CHECK(d["name"] == (*want)[i].name);
      CHECK(d["details"] == (*want)[i].details);
      CHECK(d["memory_total"] == (*want)[i].memory_total);
      CHECK(d["memory_free"].get<size_t>() <= d["memory_total"].get<size_t>());
      CHECK(d["device"] == (backends[b] == "cpu" ? "cpu" : backends[b] + ":" + std::to_string(i)));
    }
  }
  // The CPU is always there: its model, cores and kernel level, and the host's RAM.
  const auto& cpu = doc.back();
  REQUIRE(cpu["backend"] == "cpu");
  REQUIRE(cpu["devices"].size() == 1);
  CHECK(!cpu["devices"][0]["name"].get<std::string>().empty());
  CHECK(cpu["devices"][0]["details"].get<std::string>().find("physical cores") != std::string::npos);
  CHECK(cpu["devices"][0]["memory_total"].get<size_t>() > (size_t{256} << 20));

  auto text = run_kite({"devices"});
  CHECK(text.exit_code == 0);
  for (const std::string& b : backends) CHECK(text.out.find(b) != std::string::npos);
  CHECK(text.out.find(cpu["devices"][0]["name"].get<std::string>()) != std::string::npos);
  auto bad = run_kite({"devices", "--all"});
  CHECK(bad.exit_code == 2);
}
