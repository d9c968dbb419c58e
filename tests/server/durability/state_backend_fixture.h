// What the state store's tests share: temporary directories, a real
// redis-server on loopback (started, paused, killed), and unguarded appends.
#ifndef TXL_TESTS_SERVER_DURABILITY_STATE_BACKEND_FIXTURE_H_
#define TXL_TESTS_SERVER_DURABILITY_STATE_BACKEND_FIXTURE_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/durability/state_backend.h"

extern char** environ;

namespace txl::testing {

inline constexpr char kRedisServer[] = "/usr/bin/redis-server";

// A fresh directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = absl::StrCat(base != nullptr ? base : "/tmp", "/state_backend_test.XXXXXX");
    path_ = mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A loopback port nobody is using now (the socket is closed again).
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

inline StateBackendConfig RedisConfig(int port, const std::string& prefix) {
  StateBackendConfig config;
  config.spec = absl::StrCat("redis://127.0.0.1:", port, "/", prefix);
  config.redis_timeout = absl::Seconds(2);
  return config;
}

// redis-server on 127.0.0.1 with no persistence, killed on destruction.
class RedisServer {
 public:
  static bool Installed() { return access(kRedisServer, X_OK) == 0; }

  // On `port` (0: a free one); null (and `error` says why) if it never answers.
  static std::unique_ptr<RedisServer> Start(int port, std::string* error) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      // A free port can be taken between FreePort() and the server's bind: try another.
      auto server = std::unique_ptr<RedisServer>(new RedisServer(port != 0 ? port : FreePort()));
      if (server->Spawn(error) && server->AwaitPing(absl::Seconds(15), error)) return server;
      if (port != 0) break;
    }
    return nullptr;
  }

  ~RedisServer() { Kill(); }

  int port() const { return port_; }
  // SIGSTOP / SIGCONT: a server that hangs, and comes back.
  void Pause() { kill(pid_, SIGSTOP); }
  void Resume() { kill(pid_, SIGCONT); }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  explicit RedisServer(int port) : port_(port) {}

  bool Spawn(std::string* error) {
    const std::string log = absl::StrCat(dir_.path(), "/redis.log");
    std::vector<std::string> args = {
        kRedisServer, "--port", std::to_string(port_), "--bind",      "127.0.0.1", "--save", "", "--appendonly",
        "no",         "--dir",  dir_.path(),           "--daemonize", "no"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc = posix_spawn(&pid_, kRedisServer, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      pid_ = -1;
      *error = absl::StrCat("posix_spawn ", kRedisServer, ": ", strerror(rc));
      return false;
    }
    return true;
  }

  // Polls with PINGs (OpenStateBackend sends one) until the deadline.
  bool AwaitPing(absl::Duration timeout, std::string* error) {
    const absl::Time deadline = absl::Now() + timeout;
    StateBackendConfig config = RedisConfig(port_, "probe");
    config.redis_timeout = absl::Milliseconds(500);
    while (absl::Now() < deadline) {
      auto backend = OpenStateBackend(config);
      if (backend.ok()) return true;
      *error = std::string(backend.status().message());
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        std::ifstream in(absl::StrCat(dir_.path(), "/redis.log"));
        *error = absl::StrCat("redis-server exited: ", std::string(std::istreambuf_iterator<char>(in), {}));
        return false;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    Kill();
    return false;
  }

  const int port_;
  TempDir dir_;
  pid_t pid_ = -1;
};

// Unguarded appends, one write per (key, value), as one group commit.
inline absl::Status Append(StateBackend* backend, const std::vector<std::pair<std::string, std::string>>& appends) {
  std::vector<StoreWrite> writes;
  for (const auto& [key, value] : appends) writes.push_back({"append", {}, {{StoreMutation::kAppend, key, value}}});
  std::vector<int> outcomes;
  return backend->Write(writes, &outcomes);
}

}  // namespace txl::testing

#endif  // TXL_TESTS_SERVER_DURABILITY_STATE_BACKEND_FIXTURE_H_
