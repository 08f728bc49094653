// Helpers for tests that read ../shared/testdata (path from CMake's KITE_TESTDATA_DIR).
// A missing file fails the test loudly: nothing here skips.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kite::test {

inline std::string testdata(const std::string& rel) {
  std::filesystem::path p = std::filesystem::path(KITE_TESTDATA_DIR) / rel;
  REQUIRE_MESSAGE(std::filesystem::exists(p), "missing test data: ", p.string());
  return p.string();
}

// Files in a testdata subfolder whose names end with `suffix`, sorted; fails if there are none.
inline std::vector<std::string> testdata_files(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(testdata(dir))) {
    const std::string name = e.path().filename().string();
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  REQUIRE_MESSAGE(!out.empty(), "no *", suffix, " files in ", dir);
  return out;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot read ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A fresh scratch folder under the build tree for one test.
inline std::filesystem::path scratch_dir(const std::string& name) {
  std::filesystem::path p = std::filesystem::path(KITE_BINARY_DIR) / "test-scratch" / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

// The trained test models, each with the llama.cpp-written f16 GGUF of it where there is one.
struct ModelCase {
  const char* model;  // models/<model>
  const char* gguf;   // relative to the test data; nullptr: none
  bool bf16;          // the folder's weights are bf16 (else f16)
};
inline constexpr ModelCase kModelCases[] = {
    {"llama-target", nullptr, true},  // no f16 GGUF of the target in the test data
    {"llama-draft", "gguf/llama-draft-f16.gguf", true},
    {"qwen2-tiny", "gguf/qwen2-tiny-f16.gguf", false},
    {"qwen3-tiny", "gguf/qwen3-tiny-f16.gguf", true},
};

}  // namespace kite::test
