// Runs a command (the built kite binary) for end-to-end tests: exit code, stdout, stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/testdata.h"

namespace kite::test {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal if killed by a signal
  std::string out;
  std::string err;
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `kite ARGS...` (stdin from `input`, or /dev/null).
inline ProcessResult run_kite(const std::vector<std::string>& args, const std::string& input = {}) {
  static int counter = 0;
  const auto dir = std::filesystem::path(KITE_BINARY_DIR) / "test-scratch" / "proc";
  std::filesystem::create_directories(dir);
  const std::string base = (dir / (std::to_string(::getpid()) + "-" + std::to_string(counter++))).string();
  std::string cmd = shell_quote(KITE_EXE);
  for (const auto& a : args) cmd.append(" ").append(shell_quote(a));  // (not " " + x: g++ 12's -Wrestrict false positive)
  if (!input.empty()) {
    FILE* in = std::fopen((base + ".in").c_str(), "wb");
    std::fwrite(input.data(), 1, input.size(), in);
    std::fclose(in);
    cmd += " <" + shell_quote(base + ".in");
  } else {
    cmd += " </dev/null";
  }
  cmd += " >" + shell_quote(base + ".out") + " 2>" + shell_quote(base + ".err");
  const int status = std::system(cmd.c_str());
  ProcessResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) r.exit_code = 128 + WTERMSIG(status);
  r.out = read_file(base + ".out");
  r.err = read_file(base + ".err");
  std::filesystem::remove(base + ".out");
  std::filesystem::remove(base + ".err");
  std::filesystem::remove(base + ".in");
  return r;
}

}  // namespace kite::test
