// kite inspect FILE|DIR — what a model file or Hugging Face folder holds.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "formats/weight_source.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace kite::tools {
namespace {

using nlohmann::ordered_json;

// A value as JSON; long arrays are summarized unless `full`.
ordered_json value_json(const gguf::Value& v, bool full) {
  return std::visit(
      [&](const auto& x) -> ordered_json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, gguf::Array>) {
          if (!full && x.items.size() > 8) {
            ordered_json o;
            o["type"] = "array";
            o["elem_type"] = std::string(gguf::value_type_name(x.elem_type));
            o["length"] = x.items.size();
            return o;
          }
          ordered_json a = ordered_json::array();
          for (const auto& item : x.items) a.push_back(value_json(item, full));
          return a;
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!full && x.size() > 200) return x.substr(0, 200) + "... (" + std::to_string(x.size()) + " bytes)";
          return x;
        } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
          return static_cast<int>(x);
        } else {
          return x;
        }
      },
      v.v);
}

std::string value_text(const gguf::Value& v) {
  if (const auto* a = v.get_if<gguf::Array>()) {
    if (a->items.size() > 8)
      return "[" + std::string(gguf::value_type_name(a->elem_type)) + " x " + std::to_string(a->items.size()) + "]";
  }
  std::string s = value_json(v, false).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return s;
}

std::string shape_text(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

struct Summary {
  std::string arch;
  ordered_json hparams = ordered_json::object();
  ordered_json tokenizer = ordered_json::object();
};

Summary summarize(const gguf::Metadata& meta) {
  Summary s;
  if (auto a = meta.get<std::string>("general.architecture")) s.arch = *a;
  const std::string prefix = s.arch + ".";
  for (const auto& kv : meta.entries())
    if (!s.arch.empty() && kv.key.rfind(prefix, 0) == 0) s.hparams[kv.key.substr(prefix.size())] = value_json(kv.value, false);
  auto count = [&](const char* key) -> int64_t {
    const gguf::Value* v = meta.find(key);
    const auto* a = v ? v->get_if<gguf::Array>() : nullptr;
    return a ? static_cast<int64_t>(a->items.size()) : -1;
  };
  if (auto m = meta.get<std::string>("tokenizer.ggml.model")) s.tokenizer["model"] = *m;
  if (auto p = meta.get<std::string>("tokenizer.ggml.pre")) s.tokenizer["pre"] = *p;
  if (count("tokenizer.ggml.tokens") >= 0) s.tokenizer["tokens"] = count("tokenizer.ggml.tokens");
  if (count("tokenizer.ggml.merges") >= 0) s.tokenizer["merges"] = count("tokenizer.ggml.merges");
  for (const char* id : {"bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"})
    if (auto v = meta.get_int(std::string("tokenizer.ggml.") + id)) s.tokenizer[id] = *v;
  if (auto t = meta.get<std::string>("tokenizer.chat_template")) s.tokenizer["chat_template_bytes"] = t->size();
  return s;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What was opened: a GGUF file (read directly, so container details show), a single
// .safetensors file (raw names), or a folder through WeightSource (GGUF-convention view).
struct Opened {
  std::string format;
  std::optional<gguf::File> gguf_file;
  std::optional<safetensors::File> st_file;
  std::unique_ptr<WeightSource> source;
  gguf::Metadata st_meta;
  std::vector<TensorInfo> st_tensors;
};

Result<Opened> open_any(const std::string& path) {
  Opened o;
  if (std::filesystem::is_directory(path)) {
    KITE_ASSIGN_OR_RETURN(o.source, WeightSource::open(path));
    o.format = std::string(o.source->format()) + " (Hugging Face folder)";
  } else if (ends_with(path, ".safetensors")) {
    KITE_ASSIGN_OR_RETURN(o.st_file, safetensors::File::open(path));
    o.format = "safetensors";
    o.st_meta = gguf::Metadata(path);
    for (const auto& [k, v] : o.st_file->metadata()) o.st_meta.set(k, gguf::Value(v));
    for (const auto& t : o.st_file->tensors()) o.st_tensors.push_back(t.info());
  } else {
    KITE_ASSIGN_OR_RETURN(o.gguf_file, gguf::File::open(path));
    o.format = "gguf";
  }
  return o;
}

int run_inspect(const std::string& path, bool json) {
  auto opened = open_any(path);
  if (!opened) {
    std::cerr << "kite inspect: " << opened.error().message << "\n";
    return kExitFailure;
  }
  const Opened& o = *opened;
  const auto& gguf_file = o.gguf_file;
  const gguf::Metadata& meta = gguf_file ? gguf_file->metadata() : o.source ? o.source->metadata() : o.st_meta;
  const std::vector<TensorInfo>& tensors =
      gguf_file ? gguf_file->tensors() : o.source ? o.source->tensors() : o.st_tensors;
  const Summary sum = summarize(meta);
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.nbytes;

  if (json) {
    ordered_json doc;
    doc["path"] = path;
    doc["format"] = o.gguf_file ? "gguf" : o.source ? std::string(o.source->format()) : "safetensors";
    if (gguf_file) {
      doc["gguf_version"] = gguf_file->version();
      doc["alignment"] = gguf_file->alignment();
      doc["data_offset"] = gguf_file->data_offset();
      doc["file_bytes"] = gguf_file->file_size();
    }
    doc["architecture"] = sum.arch;
    doc["hyperparameters"] = sum.hparams;
    doc["tokenizer"] = sum.tokenizer;
    ordered_json md = ordered_json::object();
    for (const auto& kv : meta.entries()) md[kv.key] = value_json(kv.value, false);
    doc["metadata"] = md;
    ordered_json ts = ordered_json::array();
    for (const auto& t : tensors) {
      const auto* tr = quant::find_traits(t.type);
      ts.push_back({{"name", t.name}, {"type", std::string(tr->name)}, {"shape", t.ne}, {"bytes", t.nbytes}, {"offset", t.offset}});
    }
    doc["tensor_bytes"] = total;
    doc["tensors"] = ts;
    std::cout << doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return kExitOk;
  }

  std::cout << "path:          " << path << "\n";
  if (gguf_file)
    std::cout << "format:        GGUF v" << gguf_file->version() << ", alignment " << gguf_file->alignment()
              << ", data at byte " << gguf_file->data_offset() << ", " << human_bytes(gguf_file->file_size()) << "\n";
  else
    std::cout << "format:        " << o.format << "\n";
  std::cout << "architecture:  " << (sum.arch.empty() ? "(none)" : sum.arch) << "\n";
  if (!sum.hparams.empty()) {
    std::cout << "hyperparameters:\n";
    for (const auto& [k, v] : sum.hparams.items()) std::cout << "  " << k << " = " << v.dump() << "\n";
  }
  if (!sum.tokenizer.empty()) {
    std::cout << "tokenizer:\n";
    for (const auto& [k, v] : sum.tokenizer.items()) std::cout << "  " << k << " = " << v.dump() << "\n";
  }
  std::cout << "metadata (" << meta.size() << " keys):\n";
  for (const auto& kv : meta.entries()) std::cout << "  " << kv.key << " = " << value_text(kv.value) << "\n";
  std::cout << "tensors (" << tensors.size() << ", " << human_bytes(total) << "):\n";
  for (const auto& t : tensors) {
    const auto* tr = quant::find_traits(t.type);
    std::printf("  %-40s %-7s %-22s %12llu bytes  @ %llu\n", t.name.c_str(), std::string(tr->name).c_str(),
                shape_text(t.ne).c_str(), static_cast<unsigned long long>(t.nbytes),
                static_cast<unsigned long long>(t.offset));
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

void register_inspect(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("inspect", "Show a model's architecture, hyperparameters, tokenizer and tensors");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("path", *path, "A GGUF file or a Hugging Face folder")->required();
  cmd->add_flag("--json", *json, "Print one JSON document for scripts");
  cmd->callback([run, path, json] { *run = [path, json] { return run_inspect(*path, *json); }; });
}

}  // namespace kite::tools
