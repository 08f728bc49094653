// kite tokenize -m MODEL [--no-bos] [--parse-special] [--ids-only] [--file F | TEXT] [--bench]
// Prints the token ids of a text, one `id<TAB>'piece'` per line (or the ids on one line).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "formats/weight_source.h"
#include "src/runtime/tokenizer.h"
#include "tools/commands.h"

namespace kite::tools {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  std::string file;
  bool no_bos = false;
  bool parse_special = false;
  bool ids_only = false;
  bool bench = false;
};

// A piece made readable: quotes, backslashes and control bytes escaped, bytes that are not
// UTF-8 shown as \xNN.
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\\')
      out += "\\\\";
    else if (c == '\'')
      out += "\\'";
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      const size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      bool ok = n > 1 && i + n <= s.size();
      for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
      if (ok) {
        out.append(s, i, n);
        i += n - 1;
      } else {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\x%02X", c);
        out += buf;
      }
    }
  }
  return out;
}

int run_tokenize(const TokenizeArgs& a) {
  std::string text = a.text;
  if (!a.file.empty()) {
    std::ifstream f(a.file, std::ios::binary);
    if (!f) {
      std::cerr << "kite tokenize: cannot read " << a.file << "\n";
      return kExitFailure;
    }
    std::ostringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  auto src = WeightSource::open(a.model);
  if (!src) {
    std::cerr << "kite tokenize: " << src.error().message << "\n";
    return kExitFailure;
  }
  auto tok = Tokenizer::load((*src)->metadata());
  if (!tok) {
    std::cerr << "kite tokenize: " << tok.error().message << "\n";
    return kExitFailure;
  }
  const EncodeOptions opt{.add_special = !a.no_bos, .parse_special = a.parse_special};
  std::vector<TokenId> ids = (*tok)->encode(text, opt);

  if (a.bench) {
    // Wall time and this thread's CPU time (the second is what to compare on a busy machine).
    std::vector<double> wall, cpu;
    for (int run = 0; run < 5; ++run) {
      timespec c0, c1;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
      auto t0 = std::chrono::steady_clock::now();
      ids = (*tok)->encode(text, opt);
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
      cpu.push_back((c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9);
    }
    std::sort(wall.begin(), wall.end());
    std::sort(cpu.begin(), cpu.end());
    const double w = wall[2], c = cpu[2];
    std::printf(
        "%zu bytes -> %zu tokens, 1 thread, median of 5 runs: wall %.1f ms (%.2f M tokens/s, "
        "%.1f MB/s), cpu %.1f ms (%.2f M tokens/s, %.1f MB/s)\n",
        text.size(), ids.size(), w * 1e3, ids.size() / w / 1e6, text.size() / w / 1e6, c * 1e3, ids.size() / c / 1e6,
        text.size() / c / 1e6);
    return kExitOk;
  }
  if (a.ids_only) {
    std::string line;
    for (TokenId id : ids) line += std::to_string(id) + " ";
    if (!line.empty()) line.pop_back();
    std::cout << line << "\n";
    return kExitOk;
  }
  for (TokenId id : ids) std::cout << id << "\t'" << printable((*tok)->token_bytes(id)) << "'\n";
  return kExitOk;
}

}  // namespace

void register_tokenize(CLI::App& app, Action* run) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  cmd->add_option("-m,--model", args->model, "GGUF file or Hugging Face folder")->required();
  cmd->add_option("text", args->text, "Text to tokenize");
  cmd->add_option("-f,--file", args->file, "Read the text from a file");
  cmd->add_flag("--no-bos", args->no_bos, "Do not add BOS/EOS (the model's add_bos/add_eos)");
  cmd->add_flag("--parse-special", args->parse_special, "Match control tokens written in the text");
  cmd->add_flag("--ids-only", args->ids_only, "Print only the ids, space separated");
  cmd->add_flag("--bench", args->bench, "Time the encoding (median of 5 runs) and print tokens/s");
  cmd->callback([args, run] { *run = [args] { return run_tokenize(*args); }; });
}

}  // namespace kite::tools
