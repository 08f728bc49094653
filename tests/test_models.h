// The test models as the engine tests use them: a model and its tokenizer from a path in the
// test data (a Hugging Face folder or a GGUF file), loaded once per test binary and shared.
#pragma once

#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <string>

#include "formats/weight_source.h"
#include "src/model/model.h"
#include "src/runtime/tokenizer.h"
#include "tests/testdata.h"

namespace kite::test {

struct LoadedModel {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tok;
};

inline const LoadedModel& load_model(const std::string& rel) {
  static std::map<std::string, LoadedModel> cache;
  if (auto it = cache.find(rel); it != cache.end()) return it->second;
  auto src = WeightSource::open(testdata(rel));
  REQUIRE_MESSAGE(src.ok(), rel, ": ", (src.ok() ? std::string() : src.error().message));
  auto tok = Tokenizer::load((*src)->metadata());
  REQUIRE_MESSAGE(tok.ok(), rel, ": ", (tok.ok() ? std::string() : tok.error().message));
  auto model = Model::from_source(std::move(*src));
  REQUIRE_MESSAGE(model.ok(), rel, ": ", (model.ok() ? std::string() : model.error().message));
  return cache[rel] = LoadedModel{*model, *tok};
}

}  // namespace kite::test
