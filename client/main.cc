// txl-client: command-line client of txl-server.
//   txl-client [flags] generate TEXT      stream a generation
//   txl-client [flags] chat               a REPL on one session; each line sends only new text
//                                         (/help, /undo, /retry, /quit; Ctrl-C cancels a reply)
//   txl-client [flags] score FILE         per-token log-probs / perplexity of a file
//   txl-client [flags] sessions list|get|delete|fork [ID] | fork ID POS | rewind ID POS
//                               | export ID FILE | import FILE
//   txl-client [flags] create             create a session and print its id
//   txl-client [flags] info | health
//   txl-client [flags] bench [--sessions N] [--turns T] [--input-tokens I] [--new-tokens G]
//                            [--duration S] [--json FILE]      load generator (client/load_generator.h)
// Errors print the gRPC status and exit non-zero (chat: only at start-up; a
// failed line prints its error and the REPL goes on).
// Security: --token (or the TXL_TOKEN environment variable) and the --tls_* flags.
#include <fcntl.h>
#include <google/protobuf/stubs/common.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/flags_help.h"
#include "base/read_file.h"
#include "base/status_macros.h"
#include "client/load_generator.h"
#include "client/txl_client.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "txl-server address");
ABSL_FLAG(std::string, session, "", "session id (empty: a throw-away session for generate/score)");
ABSL_FLAG(int, max_new_tokens, 64, "tokens to generate");
ABSL_FLAG(double, temperature, 0.8, "sampling temperature (0: greedy)");
ABSL_FLAG(int, top_k, 0, "sample from the k most likely tokens (0: all)");
ABSL_FLAG(double, top_p, 0, "nucleus sampling mass (0: off)");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed (0: random)");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop sequences, comma-separated");
ABSL_FLAG(std::vector<std::string>, logit_bias, {},
          "ID:BIAS pairs, comma-separated: BIAS in [-100, 100] added to token ID's logit (-100 bans it)");
ABSL_FLAG(double, presence_penalty, 0, "in [-2, 2]: lowers tokens already generated, once");
ABSL_FLAG(double, frequency_penalty, 0, "in [-2, 2]: lowers tokens already generated, per time");
ABSL_FLAG(int64_t, mem_len, 0, "create: the session's window (0: server default)");
ABSL_FLAG(int64_t, ttl, 0, "create: idle seconds before the session expires (0: server default)");
ABSL_FLAG(bool, no_commit, false, "score: leave the session untouched");
ABSL_FLAG(double, timeout, 300, "seconds per call");
ABSL_FLAG(std::string, token, "",
          "bearer token for a server with --auth_tokens (default: the TXL_TOKEN environment variable)");
ABSL_FLAG(bool, tls, false, "connect with TLS, verifying the server against gRPC's default roots");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots that verify the server (implies --tls)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS (with --tls_key; implies --tls)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the server's certificate must carry, instead of the --server host (implies --tls)");

namespace {

int Error(const absl::Status& s) {
  std::cerr << "txl-client: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << std::endl;
  return 1;
}

int Usage(const std::string& msg) {
  std::cerr << "txl-client: " << msg << "\n" << absl::ProgramUsageMessage() << std::endl;
  return 2;
}

// --logit_bias's ID:BIAS pairs into `s`; INVALID_ARGUMENT naming a pair that is not one.
absl::Status ReadLogitBias(txl::v1::SamplingParams* s) {
  for (const std::string& pair : absl::GetFlag(FLAGS_logit_bias)) {
    const std::vector<std::string> parts = absl::StrSplit(pair, ':');
    int id = 0;
    float bias = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &id) || !absl::SimpleAtof(parts[1], &bias)) {
      return absl::InvalidArgumentError("--logit_bias: \"" + pair + "\" is not ID:BIAS");
    }
    (*s->mutable_logit_bias())[id] = bias;
  }
  return absl::OkStatus();
}

txl::v1::GenerateRequest GenerateRequest(const std::string& text) {
  txl::v1::GenerateRequest req;
  req.set_session_id(absl::GetFlag(FLAGS_session));
  if (!text.empty()) req.mutable_input()->set_text(text);
  req.set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  auto* s = req.mutable_sampling();
  s->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  s->set_top_k(absl::GetFlag(FLAGS_top_k));
  s->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  s->set_seed(absl::GetFlag(FLAGS_seed));
  (void)ReadLogitBias(s);  // main checked it
  s->set_presence_penalty(static_cast<float>(absl::GetFlag(FLAGS_presence_penalty)));
  s->set_frequency_penalty(static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty)));
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) req.add_stop_sequences(stop);
  return req;
}

void PrintSession(const txl::v1::Session& s) {
  std::cout << s.session_id() << " position=" << s.position() << " mem_len=" << s.mem_len()
            << " memory_tokens=" << s.memory_tokens() << " memory_bytes=" << s.memory_bytes()
            << " ttl=" << s.idle_ttl_seconds() << "s" << (s.busy() ? " busy" : "") << "\n";
}

const char* FinishName(txl::v1::FinishReason r) {
  switch (r) {
    case txl::v1::FINISH_REASON_LENGTH: return "length";
    case txl::v1::FINISH_REASON_STOP_TOKEN: return "stop_token";
    case txl::v1::FINISH_REASON_STOP_SEQUENCE: return "stop_sequence";
    case txl::v1::FINISH_REASON_CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

// Streams one generation to stdout; the summary goes to stderr. `ctx`: see
// TxlClient::Generate.
absl::Status Stream(txl::TxlClient& client, const txl::v1::GenerateRequest& req, grpc::ClientContext* ctx = nullptr,
                    txl::v1::GenerateResponse* final_response = nullptr) {
  txl::v1::GenerateResponse last;
  absl::Status s = client.Generate(
      req,
      [&](const txl::v1::GenerateResponse& r) {
        std::cout << r.text() << std::flush;
        if (r.finish_reason() != txl::v1::FINISH_REASON_UNSPECIFIED) last = r;
      },
      ctx);
  std::cout << std::endl;
  if (!s.ok()) return s;
  const auto& u = last.usage();
  std::cerr << "[" << FinishName(last.finish_reason()) << ": " << u.input_tokens() << " input, " << u.generated_tokens()
            << " generated, first token " << static_cast<int>(u.time_to_first_token_seconds() * 1000) << " ms, "
            << (u.total_seconds() > 0 ? u.generated_tokens() / u.total_seconds() : 0.0) << " tokens/s, position "
            << last.position() << "]" << std::endl;
  if (final_response) *final_response = last;
  return absl::OkStatus();
}

// Ctrl-C in chat. The handler may only do async-signal-safe things, so it
// writes a byte to a pipe; a thread reads it and cancels the reply in flight
// or, at the prompt, prints a hint. SA_RESTART: the prompt's read of stdin
// goes on instead of failing (which would read as end of input).
int g_interrupt_fd = -1;  // the pipe's write end

extern "C" void OnInterrupt(int) {
  const int saved = errno;
  // Non-blocking: with the pipe full, enough interrupts are pending already.
  [[maybe_unused]] const ssize_t n = write(g_interrupt_fd, "", 1);
  errno = saved;
}

class ReplyCanceller {
 public:
  ReplyCanceller() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;  // then Ctrl-C keeps its default: it ends chat
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
    read_fd_ = fds[0];
    g_interrupt_fd = fds[1];
    thread_ = std::thread([this] { Watch(); });
    struct sigaction sa = {};
    sa.sa_handler = OnInterrupt;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_);
  }
  ~ReplyCanceller() {
    if (read_fd_ < 0) return;
    sigaction(SIGINT, &old_, nullptr);
    close(g_interrupt_fd);  // the watcher reads end of file and returns
    thread_.join();
    close(read_fd_);
  }
  // Ctrl-C cancels `ctx` from now until End, which says whether it did.
  void Begin(grpc::ClientContext* ctx) {
    absl::MutexLock lock(&mu_);
    ctx_ = ctx;
    cancelled_ = false;
  }
  bool End() {
    absl::MutexLock lock(&mu_);
    ctx_ = nullptr;
    return cancelled_;
  }

 private:
  void Watch() {
    char c;
    for (ssize_t n; (n = read(read_fd_, &c, 1)) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return;
      absl::MutexLock lock(&mu_);
      if (ctx_ != nullptr) {
        ctx_->TryCancel();
        cancelled_ = true;
      } else {
        std::cerr << "\n(Ctrl-C cancels a reply; /quit or Ctrl-D leaves)\n> " << std::flush;
      }
    }
  }

  int read_fd_ = -1;
  std::thread thread_;
  struct sigaction old_ = {};
  absl::Mutex mu_;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;  // the reply in flight
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

constexpr char kChatHelp[] =
    "  /help         this list\n"
    "  /undo         take back the last turn (your line and its reply): the session rewinds to before it\n"
    "  /retry        a new reply to your last line: the session rewinds to before the reply and generates\n"
    "  /quit, /exit  leave (so does Ctrl-D); the session stays for its TTL\n"
    "  //TEXT        send /TEXT (a line that starts with / is a command, so double the /)\n"
    "  Ctrl-C        cancel the reply in flight; the session keeps what it was fed\n";

void ChatError(const absl::Status& s) {
  std::cerr << "error: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << std::endl;
}

// The server stops a cancelled reply at its next step, keeping the prefix it
// fed; until then the session is busy and the next line would get ABORTED.
// So wait for that (bounded), and report the position it kept.
// Returns that position, or -1 when it is not known.
int64_t AfterCancel(txl::TxlClient& client, const std::string& id) {
  absl::StatusOr<txl::v1::Session> s;
  for (int i = 0; i < 100; ++i) {
    s = client.GetSession(id);
    if (!s.ok() || !s->busy()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (s.ok() && !s->busy()) {
    std::cerr << "[cancelled: position " << s->position() << "]" << std::endl;
    return s->position();
  }
  std::cerr << "[cancelled]" << std::endl;
  return -1;
}

// One chat turn, for /undo and /retry: the session's position before the
// line, and where the reply began (-1: it was cancelled).
struct ChatTurn {
  int64_t before = 0, reply_start = -1;
};

// /undo and /retry; false (with the error printed) when they cannot be done.
bool ChatRewind(txl::TxlClient& client, const std::string& id, const std::string& command, std::vector<ChatTurn>& turns,
                grpc::ClientContext* ctx, txl::v1::GenerateResponse* last, absl::Status* streamed, int64_t* position) {
  if (turns.empty()) {
    ChatError(absl::FailedPreconditionError(absl::StrCat("nothing to ", command.substr(1), " in this chat yet")));
    return false;
  }
  const ChatTurn turn = turns.back();
  if (command == "/retry" && turn.reply_start < 0) {
    ChatError(absl::FailedPreconditionError("the last reply was cancelled: /undo the turn and send the line again"));
    return false;
  }
  const int64_t to = command == "/undo" ? turn.before : turn.reply_start;
  auto s = client.RewindSession(id, to);
  if (!s.ok()) {
    ChatError(s.status());
    return false;
  }
  *position = s->position();
  if (command == "/undo") {
    turns.pop_back();
    std::cerr << "[undone: position " << s->position() << "]" << std::endl;
    return false;  // nothing to stream
  }
  txl::v1::GenerateRequest req = GenerateRequest("");  // continue from the line: a new reply
  req.set_session_id(id);
  *streamed = Stream(client, req, ctx, last);
  return true;
}

// The chat REPL on session `id` (empty: a new one). Only start-up (reaching
// the server, the session) and end of input end it; a line's error is
// printed and the next line read. Prompts, notes and errors go to stderr,
// stdout gets only the replies.
int Chat(txl::TxlClient& client, std::string id) {
  if (id.empty()) {
    txl::v1::CreateSessionRequest req;
    req.set_mem_len(absl::GetFlag(FLAGS_mem_len));
    auto s = client.CreateSession(req);
    if (!s.ok()) return Error(s.status());
    id = s->session_id();
    std::cerr << "session " << id << std::endl;
  }
  int64_t position = 0;
  if (auto s = client.GetSession(id); !s.ok()) {
    return Error(s.status());
  } else {
    position = s->position();
  }
  ReplyCanceller canceller;
  std::vector<ChatTurn> turns;
  std::string line;
  while (std::cerr << "> " && std::getline(std::cin, line)) {
    if (absl::StartsWith(line, "/") && !absl::StartsWith(line, "//")) {
      const std::string command = std::string(absl::StripAsciiWhitespace(line));
      if (command == "/quit" || command == "/exit") return 0;
      if (command == "/help") {
        std::cerr << kChatHelp;
      } else if (command == "/undo" || command == "/retry") {
        grpc::ClientContext ctx;
        txl::v1::GenerateResponse last;
        absl::Status s;
        canceller.Begin(&ctx);
        const bool streamed = ChatRewind(client, id, command, turns, &ctx, &last, &s, &position);
        const bool cancelled = canceller.End();
        if (!streamed) continue;
        if (s.ok()) {
          turns.back().reply_start = last.position() - last.usage().generated_tokens();
          position = last.position();
        } else if (cancelled && s.code() == absl::StatusCode::kCancelled) {
          position = AfterCancel(client, id);
          turns.back().reply_start = -1;
        } else {
          ChatError(s);
        }
      } else {
        ChatError(absl::InvalidArgumentError(absl::StrCat(
            "unknown command '", command.substr(0, command.find_first_of(" \t")), "' (/help lists them)")));
      }
      continue;
    }
    const std::string text = (absl::StartsWith(line, "//") ? line.substr(1) : line) + "\n";
    // Input.text is a proto string: protobuf would send invalid UTF-8 anyway
    // and the server fail to parse it, answering with no useful message.
    if (!google::protobuf::internal::IsStructurallyValidUTF8(text.data(), static_cast<int>(text.size()))) {
      ChatError(absl::InvalidArgumentError("the line is not valid UTF-8, the only text Input.text carries"));
      continue;
    }
    txl::v1::GenerateRequest req = GenerateRequest(text);
    req.set_session_id(id);
    grpc::ClientContext ctx;
    canceller.Begin(&ctx);
    txl::v1::GenerateResponse last;
    const absl::Status s = Stream(client, req, &ctx, &last);
    if (canceller.End() && s.code() == absl::StatusCode::kCancelled) {
      const int64_t now = AfterCancel(client, id);
      if (now > position) turns.push_back({position, -1});
      if (now >= 0) position = now;
    } else if (!s.ok()) {
      ChatError(s);
    } else {
      turns.push_back({position, last.position() - last.usage().generated_tokens()});
      position = last.position();
    }
  }
  return 0;
}

constexpr double kYearSeconds = 365 * 24 * 3600.0;  // LoadGeneratorConfig's longest duration and timeout

// `bench`'s own flags, after the command word: --name V or --name=V (`_` may
// stand for `-`). The error names the flag.
absl::Status ParseBenchFlags(const std::vector<std::string>& args, txl::LoadGeneratorConfig* config,
                             std::string* json_path) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("bench: unexpected argument '", arg, "'"));
    }
    const size_t eq = arg.find('=');
    const std::string name = absl::StrReplaceAll(arg.substr(0, eq), {{"_", "-"}});
    if (name != "--sessions" && name != "--turns" && name != "--input-tokens" && name != "--new-tokens" &&
        name != "--duration" && name != "--json") {
      return absl::InvalidArgumentError(
          absl::StrCat("bench: unknown flag '", name, "' (global flags such as --server go before 'bench')"));
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(name, ": needs a value"));
    }
    const auto bad = [&](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat(name, ": ", why)); };
    // An integer in [lo, hi].
    const auto integer = [&](int64_t lo, int64_t hi) -> absl::StatusOr<int64_t> {
      int64_t n = 0;
      if (!absl::SimpleAtoi(value, &n)) return bad(absl::StrCat("not an integer: '", value, "'"));
      if (n < lo || n > hi) return bad(absl::StrCat("must be in [", lo, ", ", hi, "], got ", n));
      return n;
    };
    constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
    if (name == "--sessions") {
      ASSIGN_OR_RETURN(const int64_t n, integer(1, txl::LoadGeneratorConfig::kMaxSessions));
      config->sessions = static_cast<int>(n);
    } else if (name == "--turns") {
      ASSIGN_OR_RETURN(const int64_t n, integer(1, std::numeric_limits<int64_t>::max()));
      config->turns = n;
    } else if (name == "--input-tokens") {
      ASSIGN_OR_RETURN(const int64_t n, integer(1, kIntMax));
      config->input_tokens = static_cast<int>(n);
    } else if (name == "--new-tokens") {
      ASSIGN_OR_RETURN(const int64_t n, integer(1, kIntMax));
      config->new_tokens = static_cast<int>(n);
    } else if (name == "--duration") {
      double seconds = 0;
      if (!absl::SimpleAtod(value, &seconds)) return bad(absl::StrCat("not a number of seconds: '", value, "'"));
      if (!(seconds > 0 && seconds <= kYearSeconds)) {
        return bad(absl::StrCat("must be in (0, ", kYearSeconds, "] seconds, got ", value));
      }
      config->duration = absl::Seconds(seconds);
    } else {  // --json
      if (value.empty()) return bad("needs a file name");
      *json_path = value;
    }
  }
  return absl::OkStatus();
}

// Runs the load generator; exit 0 when no call failed, 1 when any did (or
// the run could not start), 2 for bad flags.
int Bench(const std::vector<std::string>& args, const txl::ClientOptions& options) {
  txl::LoadGeneratorConfig config;
  config.server = options.server;
  config.call_timeout = options.timeout;
  config.security = options;  // token and TLS
  config.sessions = 4;
  config.turns = 4;
  config.input_tokens = 32;
  config.new_tokens = 32;
  std::string json_path;
  if (absl::Status s = ParseBenchFlags(args, &config, &json_path); !s.ok()) return Usage(std::string(s.message()));
  const double timeout = absl::GetFlag(FLAGS_timeout);
  if (!(timeout > 0 && timeout <= kYearSeconds)) {
    return Usage(absl::StrCat("--timeout: must be in (0, ", kYearSeconds, "] seconds, got ", timeout));
  }
  if (absl::Status s = txl::ValidateLoadGeneratorConfig(config); !s.ok()) return Usage(std::string(s.message()));
  std::ofstream json;
  if (!json_path.empty()) {
    json.open(json_path, std::ios::trunc);
    if (!json) return Usage(absl::StrCat("--json: cannot open '", json_path, "' for writing: ", std::strerror(errno)));
  }
  absl::StatusOr<txl::LoadReport> report = txl::RunLoad(config);
  if (!report.ok()) return Error(report.status());
  std::cout << txl::FormatLoadReportText(*report) << std::flush;
  if (json.is_open()) {
    json << txl::FormatLoadReportJson(*report);
    json.close();
    if (!json) {
      std::cerr << "txl-client: --json: cannot write '" << json_path << "'" << std::endl;
      return 1;
    }
  }
  return report->errors_total() == 0 ? 0 : 1;
}

constexpr char kUsage[] =
    "txl-client [--server H:P] [--session ID] [--token T] [--tls_ca PEM [--tls_cert PEM --tls_key PEM] "
    "[--tls_server_name N]]\n  (generate TEXT | chat | score FILE | create | "
    "sessions list|get|delete|fork [ID] | sessions fork|rewind ID POS | sessions export ID FILE |\n"
    "  sessions import FILE | "
    "info | health |\n"
    "  bench [--sessions N=4] [--turns T=4] [--input-tokens I=32] [--new-tokens G=32] [--duration S] "
    "[--json FILE])\n"
    "bench: N sessions at once, each T greedy Generate turns of I random token ids in, G tokens out;\n"
    "  stops after T turns or S seconds; prints tokens/s, TTFT and inter-token p50/p95/p99, errors by code;\n"
    "  exit 0 when no call failed, 1 otherwise. Its flags follow the word bench.\n"
    "chat: each line of stdin sends only that line (and a newline) to one session (--session, else a new\n"
    "  one); a line's error is printed as 'error: CODE: message' and the REPL goes on. /help lists the\n"
    "  commands: /undo takes back the last turn, /retry asks for a new reply to the last line (both rewind\n"
    "  the session: RewindSession); /quit or /exit (or end of input) leaves, exit 0; a line starting with\n"
    "  // sends it with\n"
    "  one / removed; Ctrl-C cancels the reply in flight, the session keeping what it was fed.";

// The connection flags (--server, --timeout, --token or TXL_TOKEN, --tls*).
txl::ClientOptions OptionsFromFlags() {
  txl::ClientOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout));
  // The flag wins over the environment; the environment keeps the token out of `ps`.
  options.token = absl::GetFlag(FLAGS_token);
  if (options.token.empty()) {
    if (const char* env = std::getenv("TXL_TOKEN")) options.token = env;
  }
  options.tls = absl::GetFlag(FLAGS_tls);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  return options;
}

// The commands on a connected client. `args`: what absl left (args[1] is the
// command word); each returns the exit code.
using Args = std::vector<char*>;

int Health(txl::TxlClient& client) {
  auto h = client.Health();
  if (!h.ok()) return Error(h.status());
  std::cout << *h << std::endl;
  return *h == "SERVING" ? 0 : 1;
}

int Info(txl::TxlClient& client) {
  auto info = client.Info();
  if (!info.ok()) return Error(info.status());
  std::cout << info->DebugString();
  return 0;
}

int Generate(txl::TxlClient& client, const Args& args) {
  std::string text = args.size() > 2 ? args[2] : "";
  absl::Status s = Stream(client, GenerateRequest(text));
  return s.ok() ? 0 : Error(s);
}

int Create(txl::TxlClient& client) {
  txl::v1::CreateSessionRequest req;
  req.set_mem_len(absl::GetFlag(FLAGS_mem_len));
  req.set_idle_ttl_seconds(absl::GetFlag(FLAGS_ttl));
  auto s = client.CreateSession(req);
  if (!s.ok()) return Error(s.status());
  std::cout << s->session_id() << std::endl;
  return 0;
}

// score FILE: one JSON line (tokens, predicted, nll, bpc, ppl, position).
int Score(txl::TxlClient& client, const Args& args, const std::string& session) {
  if (args.size() < 3) return Usage("score needs a FILE");
  absl::StatusOr<std::string> text = txl::ReadFile(args[2]);
  if (!text.ok()) return Usage(std::string(text.status().message()));
  txl::v1::ScoreRequest req;
  req.set_session_id(session);
  req.mutable_input()->set_text(*std::move(text));
  req.set_commit(!absl::GetFlag(FLAGS_no_commit));
  auto r = client.Score(req);
  if (!r.ok()) return Error(r.status());
  int64_t n = 0;
  for (const auto& t : r->tokens()) n += t.has_logprob() ? 1 : 0;
  const double per_token = n > 0 ? -r->total_logprob() / static_cast<double>(n) : 0;
  std::cout << "{\"tokens\":" << r->tokens_size() << ",\"predicted\":" << n << ",\"nll\":" << -r->total_logprob()
            << ",\"bpc\":" << per_token / std::log(2.0) << ",\"ppl\":" << std::exp(per_token)
            << ",\"position\":" << r->position() << "}" << std::endl;
  return 0;
}

// sessions import FILE: a new session from exported bytes.
int ImportSession(txl::TxlClient& client, const Args& args) {
  if (args.size() < 4) return Usage("sessions import needs a FILE");
  absl::StatusOr<std::string> data = txl::ReadFile(args[3]);
  if (!data.ok()) return Usage(std::string(data.status().message()));
  txl::v1::ImportSessionRequest settings;
  settings.set_idle_ttl_seconds(absl::GetFlag(FLAGS_ttl));
  auto s = client.ImportSession(settings, *data);
  if (!s.ok()) return Error(s.status());
  PrintSession(*s);
  return 0;
}

// sessions export ID FILE
int ExportSession(txl::TxlClient& client, const Args& args, const std::string& id) {
  if (args.size() < 5) return Usage("sessions export needs an ID and a FILE");
  auto data = client.ExportSession(id);
  if (!data.ok()) return Error(data.status());
  if (absl::Status w = txl::WriteFile(args[4], *data); !w.ok()) return Usage(std::string(w.message()));
  std::cerr << "exported " << data->size() << " bytes to " << args[4] << std::endl;
  return 0;
}

// sessions fork ID [POS] | sessions rewind ID POS (`sub`: fork or rewind)
int ForkOrRewind(txl::TxlClient& client, const Args& args, const std::string& sub, const std::string& id) {
  int64_t position = 0;
  if (args.size() > 4 && !absl::SimpleAtoi(args[4], &position))
    return Usage(absl::StrCat("sessions ", sub, ": POS must be an integer, got '", args[4], "'"));
  if (sub == "rewind" && args.size() < 5) return Usage("sessions rewind needs an ID and a POS");
  absl::StatusOr<txl::v1::Session> s;
  if (sub == "fork") {
    txl::v1::ForkSessionRequest req;
    req.set_session_id(id);
    req.set_position(position);
    s = client.ForkSession(req);
  } else {
    s = client.RewindSession(id, position);
  }
  if (!s.ok()) return Error(s.status());
  PrintSession(*s);
  return 0;
}

// sessions list|get|delete|fork|rewind|export|import ...; the ID defaults to --session.
int Sessions(txl::TxlClient& client, const Args& args, const std::string& session) {
  const std::string sub = args.size() > 2 ? args[2] : "list";
  const std::string id = args.size() > 3 ? args[3] : session;
  if (sub == "list") {
    auto l = client.ListSessions();
    if (!l.ok()) return Error(l.status());
    for (const auto& s : l->sessions()) PrintSession(s);
    return 0;
  }
  if (sub == "import") return ImportSession(client, args);
  if (id.empty()) return Usage(absl::StrCat("sessions ", sub, " needs an ID"));
  if (sub == "get") {
    auto s = client.GetSession(id);
    if (!s.ok()) return Error(s.status());
    PrintSession(*s);
    return 0;
  }
  if (sub == "delete") {
    absl::Status s = client.DeleteSession(id);
    return s.ok() ? 0 : Error(s);
  }
  if (sub == "export") return ExportSession(client, args, id);
  if (sub == "fork" || sub == "rewind") return ForkOrRewind(client, args, sub, id);
  return Usage(absl::StrCat("unknown sessions command '", sub, "'"));
}

}  // namespace

int main(int argc, char** argv) {
  txl::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage(kUsage);
  // `bench` has flags of its own after the command word: absl parses what precedes them.
  int global_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "bench") == 0) {
      global_argc = i + 1;
      break;
    }
  }
  const std::vector<std::string> bench_args(argv + global_argc, argv + argc);
  Args args = absl::ParseCommandLine(global_argc, argv);
  if (args.size() < 2) return Usage("no command");
  const std::string cmd = args[1];
  const txl::ClientOptions options = OptionsFromFlags();
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return Usage("--tls_cert and --tls_key go together");
  }
  if (txl::v1::SamplingParams probe; !ReadLogitBias(&probe).ok())
    return Usage(std::string(ReadLogitBias(&probe).message()));
  if (cmd == "bench") {
    if (args.size() > 2) return Usage(absl::StrCat("bench: unexpected argument '", args[2], "'"));
    // The load generator makes its own plaintext channels, without a token.
    return Bench(bench_args, options);
  }
  auto client_or = txl::TxlClient::Create(options);
  if (!client_or.ok()) return Error(client_or.status());
  txl::TxlClient& client = **client_or;
  const std::string session = absl::GetFlag(FLAGS_session);

  if (cmd == "health") return Health(client);
  if (cmd == "info") return Info(client);
  if (cmd == "generate") return Generate(client, args);
  if (cmd == "create") return Create(client);
  if (cmd == "chat") return Chat(client, session);
  if (cmd == "score") return Score(client, args, session);
  if (cmd == "sessions") return Sessions(client, args, session);
  return Usage(absl::StrCat("unknown command '", cmd, "'"));
}
