// kite chat -m MODEL [--template NAME|FILE] [--system TEXT] [-n N] [sampling flags]
//
// An interactive conversation: each user turn is rendered with the model's chat template (or
// --template, or the built-in chatml when the model has none) together with the history, and the
// whole conversation is resubmitted to the scheduler; its prefix cache makes that compute only the
// new tokens. The reply streams to stdout; notices and the per-reply stats go to stderr.
//
// Input: one line is one user turn. A line ending in `\` continues on the next line; a line
// starting with `"""` opens a block that ends at a line ending in `"""`. Lines starting with `/`
// are commands (/help lists them). The `> ` prompt is printed only when stdin is a terminal, so a
// script of turns can be piped in. Ctrl-C while a reply streams stops that reply; Ctrl-C at an
// empty prompt, Ctrl-D (end of input) or /exit ends the chat.
//
// When the next turn does not fit the context (prompt + the reply budget -n), the oldest
// user/assistant turns are dropped (the system message stays) and a notice on stderr says so.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/runtime/chat_template.h"
#include "src/runtime/scheduler.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace kite::tools {
namespace {

using OJson = nlohmann::ordered_json;

// SIGINT sets the flag and writes a byte to a self-pipe, so that a reader waiting in poll() wakes
// up even when the signal lands just before it starts waiting.
volatile std::sig_atomic_t g_interrupted = 0;
int g_sig_pipe[2] = {-1, -1};
extern "C" void on_sigint(int) {
  g_interrupted = 1;
  const int saved = errno;
  if (g_sig_pipe[1] >= 0) (void)!::write(g_sig_pipe[1], "i", 1);
  errno = saved;
}

// Whether a SIGINT came since the last call (and forgets it).
bool take_interrupt() {
  char drain[64];
  if (g_sig_pipe[0] >= 0)
    while (::read(g_sig_pipe[0], drain, sizeof drain) > 0) {
    }
  const bool got = g_interrupted != 0;
  g_interrupted = 0;
  return got;
}

struct ChatArgs {
  ModelArgs model;
  SamplerParams sampling;
  std::string template_name;
  std::string system;
  int n_predict = 256;
};

// Reads lines from fd 0 with poll(2) + read(2), so that a SIGINT interrupts a wait for input.
class LineReader {
 public:
  enum class Got { kLine, kEof, kInterrupted };

  Got next(std::string* line) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        *line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (!line->empty() && line->back() == '\r') line->pop_back();
        return Got::kLine;
      }
      if (eof_) {
        if (buf_.empty()) return Got::kEof;
        *line = std::move(buf_);
        buf_.clear();
        return Got::kLine;
      }
      if (take_interrupt()) return Got::kInterrupted;
      pollfd fds[2] = {{0, POLLIN, 0}, {g_sig_pipe[0], POLLIN, 0}};
      if (::poll(fds, g_sig_pipe[0] >= 0 ? 2 : 1, -1) < 0 && errno != EINTR) {
        eof_ = true;
        continue;
      }
      if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;  // a signal: checked above
      char tmp[4096];
      const ssize_t n = ::read(0, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        eof_ = true;
        continue;
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

 private:
  std::string buf_;
  bool eof_ = false;
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class Input { kText, kEof, kInterruptedEmpty, kDiscarded };

// One user turn (possibly several lines). Ctrl-C with a partly typed turn discards it.
Input read_turn(LineReader& in, bool tty, std::string* text) {
  auto prompt = [&](const char* p) {
    if (tty) std::cout << p << std::flush;
  };
  prompt("> ");
  std::string line;
  LineReader::Got got = in.next(&line);
  if (got == LineReader::Got::kEof) return Input::kEof;
  if (got == LineReader::Got::kInterrupted) return Input::kInterruptedEmpty;
  text->clear();
  if (line.rfind("\"\"\"", 0) == 0) {  // a """ block
    std::string body = line.substr(3);
    const bool bare = body.empty();  // a """ line of its own: the text starts on the next line
    for (bool first = true;; first = false) {
      if (ends_with(body, "\"\"\"") && (!first || body.size() >= 3)) {
        body.resize(body.size() - 3);
        if (body.empty() && !first && !text->empty() && text->back() == '\n') text->pop_back();  // a bare closing """
        *text += body;
        return Input::kText;
      }
      *text += body;
      prompt("... ");
      got = in.next(&body);
      if (got == LineReader::Got::kInterrupted) return Input::kDiscarded;
      if (got == LineReader::Got::kEof) return Input::kText;
      if (!(first && bare)) *text += "\n";
    }
  }
  while (ends_with(line, "\\")) {
    line.pop_back();
    *text += line + "\n";
    prompt("... ");
    got = in.next(&line);
    if (got == LineReader::Got::kInterrupted) return Input::kDiscarded;
    if (got == LineReader::Got::kEof) return Input::kText;
  }
  *text += line;
  return Input::kText;
}

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// --template NAME|FILE, else the model's template, else chatml (with a notice).
Result<ChatTemplate> load_template(const std::string& name, const Model& model) {
  if (name.empty()) {
    if (auto text = model.source().metadata().get<std::string>("tokenizer.chat_template")) {
      auto t = ChatTemplate::parse(*text);
      if (!t) return t.error().with_context("the model's chat template (choose another with --template)");
      return t;
    }
    std::cerr << "kite chat: the model has no chat template; using the built-in chatml (choose one with --template)\n";
    return ChatTemplate::builtin("chatml");
  }
  const auto names = ChatTemplate::builtin_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return ChatTemplate::builtin(name);
  auto source = read_text_file(name);
  if (!source)
    return make_error(
        "--template ", name, ": neither a built-in template (",
        [&] {
          std::string s;
          for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
          return s;
        }(),
        ") nor a readable file");
  auto t = ChatTemplate::parse(*source);
  if (!t) return t.error().with_context("--template " + name);
  return t;
}

// Markers that end an assistant turn (or start the next one) in common templates. Those the
// template uses become stop tokens (when they are one special token) or stop strings.
void add_turn_stops(const std::string& source, const Tokenizer& tok, GenerationParams* p) {
  static const char* const kMarkers[] = {"<|im_end|>",          "<|im_start|>", "<|eot_id|>",    "<|eom_id|>",
                                         "<|start_header_id|>", "<|end|>",      "<end_of_turn>", "<start_of_turn>",
                                         "<|endoftext|>",       "<|user|>"};
  EncodeOptions eo;
  eo.add_special = false;
  eo.parse_special = true;
  for (const char* m : kMarkers) {
    if (source.find(m) == std::string::npos) continue;
    const std::vector<TokenId> ids = tok.encode(m, eo);
    if (ids.size() == 1 && tok.is_control(ids[0]))
      p->stop_tokens.push_back(ids[0]);
    else
      p->stop.emplace_back(m);
  }
}

class ChatSession {
 public:
  ChatSession(const ChatArgs& a, Loaded& l, ChatTemplate tmpl)
      : a_(a), l_(l), tmpl_(std::move(tmpl)), sched_(*l.ctx, l.tokenizer, {}), system_(a.system) {
    const Tokenizer& tok = *l.tokenizer;
    bos_ = tok.bos() != kNoToken ? tok.token_bytes(tok.bos()) : std::string();
    eos_ = tok.eos() != kNoToken ? tok.token_bytes(tok.eos()) : std::string();
    add_turn_stops(tmpl_.source(), tok, &gen_);
    gen_.sampling = a.sampling;
    n_ctx_ = l.ctx->kv().n_ctx();
    reply_budget_ = a.n_predict > 0 ? a.n_predict : std::max<int64_t>(1, n_ctx_ / 4);
    gen_.max_tokens = static_cast<int32_t>(reply_budget_);
  }

  // Returns false when the chat should end.
  bool command(const std::string& text);
  // One user turn: renders, fits the context, streams the reply. Errors are reported and the
  // chat goes on; a failed model step returns the error.
  Status turn(const std::string& text);

 private:
  OJson messages() const {
    OJson m = OJson::array();
    if (!system_.empty()) m.push_back({{"role", "system"}, {"content", system_}});
    for (const auto& h : history_) m.push_back(h);
    return m;
  }
  Result<std::vector<TokenId>> render() const;
  void drop_oldest_turn();
  Status save(const std::string& path) const;
  Status load(const std::string& path);

  const ChatArgs& a_;
  Loaded& l_;
  ChatTemplate tmpl_;
  Scheduler sched_;
  std::string system_;
  OJson history_ = OJson::array();  // user/assistant messages
  std::string bos_, eos_;
  GenerationParams gen_;
  int64_t n_ctx_ = 0, reply_budget_ = 0;
  uint64_t turns_ = 0;
};

Result<std::vector<TokenId>> ChatSession::render() const {
  OJson ctx = {{"messages", messages()}, {"add_generation_prompt", true}, {"bos_token", bos_}, {"eos_token", eos_}};
  auto text = tmpl_.render(ctx);
  if (!text) return text.error().with_context("the chat template rejected the conversation");
  EncodeOptions eo;
  eo.parse_special = true;
  eo.add_special = bos_.empty() || text->compare(0, bos_.size(), bos_) != 0;  // the template may write BOS
  return l_.tokenizer->encode(*text, eo);
}

void ChatSession::drop_oldest_turn() {
  // A turn is a user message and the replies after it.
  size_t n = 1;
  while (n < history_.size() && history_[n].value("role", "") != "user") ++n;
  history_.erase(history_.begin(), history_.begin() + static_cast<std::ptrdiff_t>(n));
}

Status ChatSession::turn(const std::string& text) {
  history_.push_back({{"role", "user"}, {"content", text}});
  Result<std::vector<TokenId>> prompt = render();
  int dropped = 0;
  while (prompt && static_cast<int64_t>(prompt->size()) + reply_budget_ > n_ctx_ && history_.size() > 1) {
    drop_oldest_turn();
    ++dropped;
    prompt = render();
  }
  if (dropped > 0)
    std::cerr << "kite chat: [context full: dropped the " << dropped << " oldest turn(s) of the conversation; "
              << history_.size() - 1 << " earlier message(s) kept]\n";
  if (!prompt) {
    history_.erase(history_.end() - 1);
    std::cerr << "kite chat: " << prompt.error().message << "\n";
    return ok_status();
  }
  if (static_cast<int64_t>(prompt->size()) + reply_budget_ > n_ctx_) {
    history_.erase(history_.end() - 1);
    std::cerr << "kite chat: the message does not fit: prompt " << prompt->size() << " tokens + reply budget "
              << reply_budget_ << " > context " << n_ctx_ << " (shorten it, lower -n or raise -c)\n";
    return ok_status();
  }
  Request r;
  r.prompt = std::move(*prompt);
  r.params = gen_;
  r.params.sampling.seed = a_.sampling.seed + turns_++;
  std::string reply, error;
  FinishReason reason = FinishReason::kNone;
  Usage usage;
  const auto t0 = std::chrono::steady_clock::now();
  auto t_first = t0;
  bool first = true;
  r.on_event = [&](const StreamEvent& e) {
    if (first && e.token >= 0) t_first = std::chrono::steady_clock::now(), first = false;
    std::cout << e.text << std::flush;
    reply += e.text;
    if (e.finished) reason = e.reason, error = e.error;
  };
  r.on_done = [&](const Usage& u) { usage = u; };
  auto id = sched_.submit(std::move(r));
  if (!id) {
    history_.erase(history_.end() - 1);
    std::cerr << "kite chat: " << id.error().message << "\n";
    return ok_status();
  }
  take_interrupt();
  while (!sched_.idle()) {
    if (g_interrupted && take_interrupt()) sched_.cancel(*id);
    KITE_TRY(sched_.step());
  }
  const auto t1 = std::chrono::steady_clock::now();
  std::cout << "\n" << std::flush;
  if (reason == FinishReason::kError) {
    history_.erase(history_.end() - 1);
    std::cerr << "kite chat: " << error << "\n";
    return ok_status();
  }
  history_.push_back({{"role", "assistant"}, {"content", reply}});
  const double pp = std::chrono::duration<double>(t_first - t0).count();
  const double tg = std::chrono::duration<double>(t1 - t_first).count();
  const int64_t computed = usage.prompt_tokens - usage.cached_tokens;
  std::fprintf(stderr,
               "kite chat: [prompt %lld tokens (%lld cached, %lld computed in %.3f s), reply %lld tokens in %.3f s "
               "(%.1f t/s)%s]\n",
               static_cast<long long>(usage.prompt_tokens), static_cast<long long>(usage.cached_tokens),
               static_cast<long long>(computed), pp, static_cast<long long>(usage.completion_tokens), tg,
               tg > 0 ? static_cast<double>(usage.completion_tokens) / tg : 0.0,
               reason == FinishReason::kCancelled ? ", stopped by Ctrl-C"
               : reason == FinishReason::kLength  ? ", cut at -n"
                                                  : "");
  return ok_status();
}

Status ChatSession::save(const std::string& path) const {
  std::ofstream f(path, std::ios::binary);
  if (!f) return make_error("/save ", path, ": cannot open for writing");
  f << messages().dump(2, ' ', false, OJson::error_handler_t::replace) << "\n";
  if (!f) return make_error("/save ", path, ": write failed");
  return ok_status();
}

Status ChatSession::load(const std::string& path) {
  auto text = read_text_file(path);
  if (!text) return make_error("/load ", text.error().message);
  OJson j = OJson::parse(*text, nullptr, false);
  if (j.is_discarded()) return make_error("/load ", path, ": not valid JSON");
  if (j.is_object() && j.contains("messages")) j = j["messages"];
  if (!j.is_array()) return make_error("/load ", path, ": expected a JSON array of {role, content} messages");
  std::string system;
  OJson history = OJson::array();
  for (size_t i = 0; i < j.size(); ++i) {
    const OJson& m = j[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      return make_error("/load ", path, ": message ", i, ": expected {\"role\": string, \"content\": string}");
    const std::string role = m["role"].get<std::string>();
    if (role == "system" && i == 0) {
      system = m["content"].get<std::string>();
    } else if (role == "user" || role == "assistant") {
      history.push_back({{"role", role}, {"content", m["content"]}});
    } else {
      return make_error("/load ", path, ": message ", i, ": role '", role,
                        "' (expected user or assistant, or system as the first message)");
    }
  }
  system_ = std::move(system);
  history_ = std::move(history);
  return ok_status();
}

constexpr const char* kHelp =
    "Commands:\n"
    "  /reset          forget the conversation (the system message stays)\n"
    "  /system TEXT    set the system message (empty TEXT removes it)\n"
    "  /save FILE      write the conversation as a JSON array of {role, content} messages\n"
    "  /load FILE      replace the conversation with one written by /save\n"
    "  /help           this list\n"
    "  /exit           end the chat (so do Ctrl-D and Ctrl-C at an empty prompt)\n"
    "Input: a line ending in \\ continues on the next line; \"\"\" opens and closes a multi-line block.\n"
    "Ctrl-C while a reply streams stops the reply.\n";

bool ChatSession::command(const std::string& text) {
  const size_t sp = text.find_first_of(" \t\n");
  const std::string cmd = text.substr(0, sp);
  std::string arg = sp == std::string::npos ? std::string() : text.substr(sp + 1);
  const size_t b = arg.find_first_not_of(" \t\n"), e = arg.find_last_not_of(" \t\n");
  arg = b == std::string::npos ? std::string() : arg.substr(b, e - b + 1);
  if (cmd == "/exit" || cmd == "/quit") return false;
  if (cmd == "/help") {
    std::cout << kHelp << std::flush;
  } else if (cmd == "/reset") {
    history_ = OJson::array();
    std::cerr << "kite chat: [conversation cleared]\n";
  } else if (cmd == "/system") {
    system_ = arg;
    std::cerr << (arg.empty() ? "kite chat: [system message removed]\n" : "kite chat: [system message set]\n");
  } else if (cmd == "/save" || cmd == "/load") {
    if (arg.empty()) {
      std::cerr << "kite chat: " << cmd << " needs a file name: " << cmd << " FILE\n";
      return true;
    }
    Status st = cmd == "/save" ? save(arg) : load(arg);
    if (!st)
      std::cerr << "kite chat: " << st.error().message << "\n";
    else if (cmd == "/save")
      std::cerr << "kite chat: [saved " << messages().size() << " message(s) to " << arg << "]\n";
    else
      std::cerr << "kite chat: [loaded " << messages().size() << " message(s) from " << arg << "]\n";
  } else {
    std::cerr << "kite chat: unknown command " << cmd << "; /help lists the commands\n";
  }
  return true;
}

int run_chat(const ChatArgs& a) {
  auto loaded = load_model(a.model, 1);
  if (!loaded) {
    std::cerr << "kite chat: " << loaded.error().message << "\n";
    return kExitFailure;
  }
  Loaded& l = *loaded;
  if (auto st = Sampler::validate(a.sampling, l.tokenizer->n_vocab()); !st) {
    std::cerr << "kite chat: " << st.error().message << "\n";
    return kExitUsage;
  }
  auto tmpl = load_template(a.template_name, *l.model);
  if (!tmpl) {
    std::cerr << "kite chat: " << tmpl.error().message << "\n";
    return a.template_name.empty() ? kExitFailure : kExitUsage;
  }
  ChatSession chat(a, l, std::move(*tmpl));

  if (::pipe(g_sig_pipe) == 0) {
    for (int fd : g_sig_pipe) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  struct sigaction sa = {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocked read returns EINTR
  struct sigaction old_sa = {};
  sigaction(SIGINT, &sa, &old_sa);

  const bool tty = ::isatty(0) != 0;
  if (tty) std::cerr << "kite chat: /help lists the commands; Ctrl-D ends the chat\n";
  LineReader in;
  int rc = kExitOk;
  for (;;) {
    std::string text;
    const Input got = read_turn(in, tty, &text);
    if (got == Input::kEof || got == Input::kInterruptedEmpty) {
      if (tty) std::cout << "\n" << std::flush;
      break;
    }
    if (got == Input::kDiscarded) {
      if (tty) std::cout << "\n" << std::flush;
      continue;
    }
    if (text.find_first_not_of(" \t\n") == std::string::npos) continue;
    if (text[0] == '/') {
      if (!chat.command(text)) break;
      continue;
    }
    if (auto st = chat.turn(text); !st) {
      std::cerr << "kite chat: " << st.error().message << "\n";
      rc = kExitFailure;
      break;
    }
  }
  sigaction(SIGINT, &old_sa, nullptr);
  for (int& fd : g_sig_pipe)
    if (fd >= 0) ::close(fd), fd = -1;
  return rc;
}

}  // namespace

void register_chat(CLI::App& app, Action* run) {
  auto* cmd = app.add_subcommand("chat", "Chat with a model interactively (its chat template; stdin may be a script)");
  auto a = std::make_shared<ChatArgs>();
  a->sampling.seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  add_model_flags(cmd, &a->model);
  add_sampling_flags(cmd, &a->sampling);
  cmd->add_option("--template", a->template_name,
                  "A built-in chat template (kite template --list) or a Jinja file (default: the model's)");
  cmd->add_option("--system", a->system, "The system message");
  cmd->add_option("-n,--n-predict", a->n_predict, "Tokens per reply at most (0: a quarter of the context)")
      ->check(at_least(0));
  cmd->callback([run, a] { *run = [a] { return run_chat(*a); }; });
}

}  // namespace kite::tools
