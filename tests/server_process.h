// Starts `kite serve` as a child process on a free loopback port for end-to-end tests, and
// speaks raw HTTP to it where a client library would hide what is being tested (disconnects,
// slow headers).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/testdata.h"

namespace kite::test {

class ServerProcess {
 public:
  // Runs `kite serve --port 0 ARGS...`; waits until the port is printed and /health says 200
  // (or `timeout` passes: then ok() is false and log() says why).
  explicit ServerProcess(const std::vector<std::string>& args, double timeout_s = 30) {
    spawn(args);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    if (!wait_for_port(deadline, std::chrono::milliseconds(20))) return;
    while (std::chrono::steady_clock::now() < deadline) {
      if (log().find("ready (") != std::string::npos) {
        ready_ = true;
        return;
      }
      if (exited()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Runs `kite serve --port 0 ARGS...` and returns as soon as the port is bound (printed), before
  // the model is loaded: the caller watches the start-up. ok() stays false; port() is 0 when the
  // port was not printed within `timeout_s`.
  struct NoWait {
    double timeout_s = 30;
  };
  ServerProcess(const std::vector<std::string>& args, NoWait no_wait) {
    spawn(args);
    wait_for_port(std::chrono::steady_clock::now() + std::chrono::duration<double>(no_wait.timeout_s),
                  std::chrono::milliseconds(1));
  }

  ~ServerProcess() {
    if (pid_ > 0 && status_ < 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    std::error_code ec;
    std::filesystem::remove(log_path_, ec);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  bool ok() const { return ready_ && port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return std::filesystem::exists(log_path_) ? read_file(log_path_) : std::string(); }

  // Sends `sig` and waits (up to `timeout_s`) for the exit; the exit code, 128 + signal, or -1.
  int stop(int sig = SIGTERM, double timeout_s = 20) {
    if (status_ >= 0) return status_;
    ::kill(pid_, sig);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (exited()) return status_;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

 private:
  // Polls the log every `poll` until the server prints its port; false when it exits or `deadline` passes.
  template <typename TimePoint>
  bool wait_for_port(TimePoint deadline, std::chrono::milliseconds poll) {
    while (std::chrono::steady_clock::now() < deadline && port_ == 0) {
      const std::string text = log();
      const std::string key = "://127.0.0.1:";
      if (auto p = text.find(key); p != std::string::npos) port_ = std::atoi(text.c_str() + p + key.size());
      else std::this_thread::sleep_for(poll);
      if (exited()) return false;
    }
    return port_ > 0;
  }

  void spawn(const std::vector<std::string>& args) {
    static int counter = 0;
    const auto dir = std::filesystem::path(KITE_BINARY_DIR) / "test-scratch" / "serve";
    std::filesystem::create_directories(dir);
    log_path_ = (dir / (std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".log")).string();
    std::vector<std::string> argv = {KITE_EXE, "serve", "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) ::dup2(fd, 2);
      const int devnull = ::open("/dev/null", O_RDWR);
      if (devnull >= 0) ::dup2(devnull, 0), ::dup2(devnull, 1);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      ::execv(cargv[0], cargv.data());
      std::_Exit(127);
    }
  }

  bool exited() {
    if (status_ >= 0) return true;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) != pid_) return false;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return true;
  }

  std::string log_path_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool ready_ = false;
  int status_ = -1;
};

// A raw TCP connection to 127.0.0.1:port (-1 on failure).
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until `needle` appears, the peer closes, or `timeout_s` passes; returns what was read.
inline std::string read_until(int fd, const std::string& needle, double timeout_s) {
  std::string got;
  timeval tv{0, 100 * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline && got.find(needle) == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n > 0) got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

}  // namespace kite::test
