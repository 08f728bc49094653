// The test models as the engine tests use them: a model and its tokenizer from a path in the
// test data (a Hugging Face folder or a GGUF file), loaded once per test binary and shared.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "formats/convert.h"
#include "formats/weight_source.h"
#include "src/model/model.h"
#include "src/runtime/tokenizer.h"
#include "tests/testdata.h"

namespace kite::test {

struct LoadedModel {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tok;
};

// The model and tokenizer of a GGUF file or Hugging Face folder; `what` names it in failures.
inline LoadedModel load_model_at(const std::string& path, const std::string& what) {
  auto src = WeightSource::open(path);
  REQUIRE_MESSAGE(src.ok(), what, ": ", (src.ok() ? std::string() : src.error().message));
  auto tok = Tokenizer::load((*src)->metadata());
  REQUIRE_MESSAGE(tok.ok(), what, ": ", (tok.ok() ? std::string() : tok.error().message));
  auto model = Model::from_source(std::move(*src));
  REQUIRE_MESSAGE(model.ok(), what, ": ", (model.ok() ? std::string() : model.error().message));
  return LoadedModel{*model, *tok};
}

inline const LoadedModel& load_model(const std::string& rel) {
  static std::map<std::string, LoadedModel> cache;
  if (auto it = cache.find(rel); it != cache.end()) return it->second;
  return cache[rel] = load_model_at(testdata(rel), rel);
}

// A test data file quantized by kite to `type` (a type or mix name, as `kite quantize` takes),
// written under the build tree once per test process, and loaded as load_model loads.
inline const LoadedModel& load_quantized(const std::string& rel, const std::string& type) {
  static std::map<std::string, LoadedModel> cache;
  const std::string key = rel + " " + type;
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const std::string stem = std::filesystem::path(rel).stem().string() + "-" + type;
  // (Per process: ctest runs test cases in parallel processes.)
  const std::filesystem::path dir = scratch_dir("quantized-" + stem + "-" + std::to_string(getpid()));
  const std::string out = (dir / (stem + ".gguf")).string();
  {
    auto src = WeightSource::open(testdata(rel));
    REQUIRE_MESSAGE(src.ok(), rel, ": ", (src.ok() ? std::string() : src.error().message));
    ConvertOptions opt;
    opt.type = type;
    opt.threads = 2;
    auto st = convert_model(**src, out, opt);
    REQUIRE_MESSAGE(st.ok(), rel, " -> ", type, ": ", (st.ok() ? std::string() : st.error().message));
  }
  return cache[key] = load_model_at(out, out);
}

}  // namespace kite::test
