// StateBackend (server/durability/state_backend.h): one suite run against both the
// directory backend and a real redis-server on loopback, then what is
// particular to each.
#include "server/durability/state_backend.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

extern char** environ;

namespace txl {
namespace {

namespace fs = std::filesystem;

constexpr char kRedisServer[] = "/usr/bin/redis-server";

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
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A loopback port nobody is using now (the socket is closed again).
int FreePort() {
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

StateBackendConfig RedisConfig(int port, const std::string& prefix) {
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
absl::Status Append(StateBackend* backend, const std::vector<std::pair<std::string, std::string>>& appends) {
  std::vector<StoreWrite> writes;
  for (const auto& [key, value] : appends) writes.push_back({"append", {}, {{StoreMutation::kAppend, key, value}}});
  std::vector<int> outcomes;
  return backend->Write(writes, &outcomes);
}

enum class Kind { kDirectory, kRedis };
void PrintTo(Kind kind, std::ostream* os) { *os << (kind == Kind::kRedis ? "redis" : "directory"); }

class StateBackendTest : public ::testing::TestWithParam<Kind> {
 protected:
  static void SetUpTestSuite() {}
  static void TearDownTestSuite() { redis_.reset(); }

  void SetUp() override {
    if (GetParam() == Kind::kRedis) {
      ASSERT_TRUE(RedisServer::Installed()) << kRedisServer << " is missing: scripts/install-deps.sh installs it";
      if (redis_ == nullptr) {
        std::string error;
        redis_ = RedisServer::Start(0, &error);
        ASSERT_NE(redis_, nullptr) << "redis-server did not start: " << error;
      }
    }
    backend_ = Open();
    ASSERT_NE(backend_, nullptr);
  }

  // Another backend on the same store (for the directory: the same root; for
  // Redis: the same prefix), as a second process would have.
  std::unique_ptr<StateBackend> Open() {
    StateBackendConfig config;
    if (GetParam() == Kind::kRedis) {
      config = RedisConfig(redis_->port(), prefix_);
    } else {
      config.spec = absl::StrCat("dir:", dir_.path(), "/state");
      config.fsync = FsyncPolicy::kInterval;
      config.fsync_interval = absl::Milliseconds(20);
    }
    auto backend = OpenStateBackend(config);
    EXPECT_TRUE(backend.ok()) << backend.status();
    return backend.ok() ? *std::move(backend) : nullptr;
  }

  static std::unique_ptr<RedisServer> redis_;
  TempDir dir_;
  // Each test its own key space on the shared server.
  const std::string prefix_ = absl::StrCat("t", next_prefix_++);
  std::unique_ptr<StateBackend> backend_;

 private:
  static inline int next_prefix_ = 0;
};

std::unique_ptr<RedisServer> StateBackendTest::redis_;

std::string AllBytes() {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  return bytes + std::string("\0\0tail\0", 7);
}

TEST_P(StateBackendTest, PutGetRoundTripsBinaryBytes) {
  const std::string value = AllBytes();
  ASSERT_TRUE(backend_->Put("sessions/abc/snap", value).ok());
  auto got = backend_->Get("sessions/abc/snap");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);

  const std::string big(3 << 20, '\x7f');
  ASSERT_TRUE(backend_->Put("big", big).ok());
  EXPECT_EQ(*backend_->Get("big"), big);

  ASSERT_TRUE(backend_->Put("empty", "").ok());
  auto empty = backend_->Get("empty");
  ASSERT_TRUE(empty.ok()) << empty.status();  // present, not absent
  EXPECT_EQ(*empty, "");
}

TEST_P(StateBackendTest, PutOverwrites) {
  ASSERT_TRUE(backend_->Put("k", "a long first value").ok());
  ASSERT_TRUE(backend_->Put("k", "short").ok());
  EXPECT_EQ(*backend_->Get("k"), "short");
  EXPECT_EQ(*Open()->Get("k"), "short");  // and another instance sees it
}

TEST_P(StateBackendTest, GetMissingIsNotFound) {
  EXPECT_EQ(backend_->Get("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(backend_->Get("no/such/dir").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(backend_->Put("a/b", "x").ok());
  EXPECT_EQ(backend_->Get("a").status().code(), absl::StatusCode::kNotFound);  // a "directory" is no key
  EXPECT_TRUE(absl::StrContains(backend_->Get("nope").status().message(), "nope"));
}

TEST_P(StateBackendTest, AppendKeepsOrderWithinAndAcrossGroups) {
  ASSERT_TRUE(
      Append(backend_.get(), {{"s/1/log", "a"}, {"s/2/log", "1"}, {"s/1/log", std::string("\0b", 2)}, {"s/2/log", "2"}})
          .ok());
  ASSERT_TRUE(Append(backend_.get(), {{"s/1/log", "c"}}).ok());
  ASSERT_TRUE(Append(backend_.get(), {}).ok());
  EXPECT_EQ(*backend_->Get("s/1/log"), std::string("a\0bc", 4));
  EXPECT_EQ(*backend_->Get("s/2/log"), "12");

  ASSERT_TRUE(backend_->Put("s/3/log", "put,").ok());
  ASSERT_TRUE(Append(backend_.get(), {{"s/3/log", "appended"}}).ok());
  EXPECT_EQ(*backend_->Get("s/3/log"), "put,appended");
}

TEST_P(StateBackendTest, AppendGroupOfManyKeys) {
  std::vector<std::pair<std::string, std::string>> group;
  for (int round = 0; round < 3; ++round) {
    for (int k = 0; k < 100; ++k) group.emplace_back(absl::StrCat("many/", k, "/log"), absl::StrCat(round, ","));
  }
  ASSERT_TRUE(Append(backend_.get(), group).ok());
  for (int k = 0; k < 100; ++k) EXPECT_EQ(*backend_->Get(absl::StrCat("many/", k, "/log")), "0,1,2,");
  EXPECT_EQ(backend_->List("many/")->size(), 100u);
}

TEST_P(StateBackendTest, DeleteRemovesAndAbsentIsFine) {
  ASSERT_TRUE(backend_->Put("sessions/x/meta", "m").ok());
  ASSERT_TRUE(backend_->Delete("sessions/x/meta").ok());
  EXPECT_EQ(backend_->Get("sessions/x/meta").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(backend_->Delete("sessions/x/meta").ok());
  EXPECT_TRUE(backend_->Delete("never/was").ok());
  EXPECT_TRUE(backend_->List("")->empty());
  // The key can come back (its directory was removed with it).
  ASSERT_TRUE(backend_->Put("sessions/x/meta", "again").ok());
  EXPECT_EQ(*backend_->Get("sessions/x/meta"), "again");
}

TEST_P(StateBackendTest, ListIsPrefixFilteredAndSorted) {
  for (const char* key : {"sessions/b/meta", "sessions/a/meta", "sessions/a/log", "sessionsx", "other/a", "s"}) {
    ASSERT_TRUE(backend_->Put(key, "v").ok());
  }
  using Keys = std::vector<std::string>;
  EXPECT_EQ(*backend_->List("sessions/"), (Keys{"sessions/a/log", "sessions/a/meta", "sessions/b/meta"}));
  EXPECT_EQ(*backend_->List("sessions"), (Keys{"sessions/a/log", "sessions/a/meta", "sessions/b/meta", "sessionsx"}));
  EXPECT_EQ(*backend_->List("sessions/a/m"), (Keys{"sessions/a/meta"}));
  EXPECT_EQ(*backend_->List(""),
            (Keys{"other/a", "s", "sessions/a/log", "sessions/a/meta", "sessions/b/meta", "sessionsx"}));
  EXPECT_TRUE(backend_->List("nothing")->empty());
  EXPECT_TRUE(backend_->List("sessions/a/meta/")->empty());
  // Glob characters are literal, and a prefix no key can have matches nothing.
  EXPECT_TRUE(backend_->List("s*")->empty());
  EXPECT_TRUE(backend_->List("sessions/[ab]")->empty());
  EXPECT_TRUE(backend_->List("../")->empty());
}

TEST_P(StateBackendTest, CompareAndSet) {
  EXPECT_TRUE(*backend_->CompareAndSet("claim", std::nullopt, "r1"));  // absent: set
  EXPECT_EQ(*backend_->Get("claim"), "r1");
  EXPECT_FALSE(*backend_->CompareAndSet("claim", std::nullopt, "r2"));       // present now
  EXPECT_FALSE(*backend_->CompareAndSet("claim", std::string("r9"), "r2"));  // mismatch
  EXPECT_EQ(*backend_->Get("claim"), "r1");
  EXPECT_TRUE(*backend_->CompareAndSet("claim", std::string("r1"), std::string("r2\0x", 4)));
  EXPECT_EQ(*backend_->Get("claim"), std::string("r2\0x", 4));
  EXPECT_FALSE(*backend_->CompareAndSet("other", std::string(""), "v"));  // expected "" is not absent
  EXPECT_EQ(backend_->Get("other").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(backend_->Put("empty", "").ok());
  EXPECT_TRUE(*backend_->CompareAndSet("empty", std::string(""), "full"));
}

// 8 contenders for one absent key, each through its own instance (as
// replicas would be) and all at once: exactly one wins, and it is its value.
TEST_P(StateBackendTest, AGuardedWriteChangesNothingUnlessEveryGuardHolds) {
  ASSERT_TRUE(backend_->Put("s/holder", "me#1").ok());
  ASSERT_TRUE(backend_->Put("s/log", "abc").ok());
  const StoreGuard mine{StoreGuard::kOneOf, "s/holder", {"old#0", "me#1"}};
  const StoreGuard three{StoreGuard::kLength, "s/log", {}, 3};
  std::vector<int> outcomes;
  // Applied: every mutation, in order.
  ASSERT_TRUE(backend_
                  ->Write({{"append",
                            {mine, three},
                            {{StoreMutation::kAppend, "s/log", "de"},
                             {StoreMutation::kPut, "s/snap", std::string("x\0y", 3)},
                             {StoreMutation::kDelete, "s/gone"}}}},
                          &outcomes)
                  .ok());
  EXPECT_EQ(outcomes, (std::vector<int>{kWriteApplied}));
  EXPECT_EQ(*backend_->Get("s/log"), "abcde");
  EXPECT_EQ(*backend_->Get("s/snap"), std::string("x\0y", 3));
  // Each write of a group on its own: the first one's length no longer
  // holds (guard 1), a holder that is not one of the values (guard 0), an
  // absent key that is there (guard 0); the last one applies.
  ASSERT_TRUE(
      backend_
          ->Write({{"late", {mine, three}, {{StoreMutation::kAppend, "s/log", "LATE"}}},
                   {"fenced", {{StoreGuard::kOneOf, "s/holder", {"other#2"}}}, {{StoreMutation::kPut, "s/snap", "no"}}},
                   {"create", {{StoreGuard::kAbsent, "s/holder"}}, {{StoreMutation::kPut, "s/holder", "x#3"}}},
                   {"next", {mine, {StoreGuard::kLength, "s/log", {}, 5}}, {{StoreMutation::kAppend, "s/log", "f"}}}},
                  &outcomes)
          .ok());
  EXPECT_EQ(outcomes, (std::vector<int>{1, 0, 0, kWriteApplied}));
  EXPECT_EQ(*backend_->Get("s/log"), "abcdef");
  EXPECT_EQ(*backend_->Get("s/snap"), std::string("x\0y", 3));
  EXPECT_EQ(*backend_->Get("s/holder"), "me#1");
  // Appends in one group see the lengths the group's earlier appends give.
  ASSERT_TRUE(backend_
                  ->Write({{"g1", {{StoreGuard::kLength, "s/log", {}, 6}}, {{StoreMutation::kAppend, "s/log", "gh"}}},
                           {"g2", {{StoreGuard::kLength, "s/log", {}, 8}}, {{StoreMutation::kAppend, "s/log", "i"}}},
                           {"g3", {{StoreGuard::kLength, "s/log", {}, 8}}, {{StoreMutation::kAppend, "s/log", "X"}}},
                           {"g4", {mine}, {{StoreMutation::kAppend, "s/log", "j"}}}},
                          &outcomes)
                  .ok());
  EXPECT_EQ(outcomes, (std::vector<int>{kWriteApplied, kWriteApplied, 0, kWriteApplied}));
  EXPECT_EQ(*backend_->Get("s/log"), "abcdefghij");
  // An absent key has length 0 and no value.
  ASSERT_TRUE(backend_
                  ->Write({{"new",
                            {{StoreGuard::kLength, "t/log", {}, 0}, {StoreGuard::kAbsent, "t/meta"}},
                            {{StoreMutation::kPut, "t/meta", "m"}, {StoreMutation::kAppend, "t/log", "1"}}},
                           {"again", {{StoreGuard::kAbsent, "t/meta"}}, {{StoreMutation::kPut, "t/meta", "n"}}}},
                          &outcomes)
                  .ok());
  EXPECT_EQ(outcomes, (std::vector<int>{kWriteApplied, 0}));
  EXPECT_EQ(*backend_->Get("t/meta"), "m");
  EXPECT_EQ(backend_->Write({{"bad", {}, {{StoreMutation::kPut, "../x", "v"}}}}, &outcomes).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(outcomes, (std::vector<int>{kWriteNotApplied}));
}

TEST_P(StateBackendTest, ConcurrentCompareAndSetHasOneWinner) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 20;
  std::vector<std::unique_ptr<StateBackend>> backends;
  for (int i = 0; i < kThreads; ++i) backends.push_back(i % 2 == 0 ? Open() : nullptr);
  for (int round = 0; round < kRounds; ++round) {
    const std::string key = absl::StrCat("sessions/", round, "/holder");
    std::atomic<int> winners{0};
    std::atomic<int> winner{-1};
    absl::Notification go;
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      // Half share backend_ (threads of one process), half have their own.
      StateBackend* backend = backends[i] != nullptr ? backends[i].get() : backend_.get();
      threads.emplace_back([&, backend, i] {
        go.WaitForNotification();
        auto won = backend->CompareAndSet(key, std::nullopt, absl::StrCat("replica-", i));
        ASSERT_TRUE(won.ok()) << won.status();
        if (*won) {
          ++winners;
          winner = i;
        }
      });
    }
    go.Notify();
    for (auto& t : threads) t.join();
    EXPECT_EQ(winners.load(), 1) << key;
    EXPECT_EQ(*backend_->Get(key), absl::StrCat("replica-", winner.load()));
  }
}

TEST_P(StateBackendTest, ConcurrentWritersFromManyThreads) {
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([this, i] {
      for (int n = 0; n < 50; ++n) {
        ASSERT_TRUE(Append(backend_.get(), {{"shared/log", "0123456789"}, {absl::StrCat("own/", i), "x"}}).ok());
        ASSERT_TRUE(backend_->Put(absl::StrCat("put/", i), absl::StrCat(n)).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(backend_->Get("shared/log")->size(), 8u * 50u * 10u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(*backend_->Get(absl::StrCat("own/", i)), std::string(50, 'x'));
    EXPECT_EQ(*backend_->Get(absl::StrCat("put/", i)), "49");
  }
}

TEST_P(StateBackendTest, QuarantineMovesTheValueAside) {
  const std::string damaged = AllBytes();
  ASSERT_TRUE(backend_->Put("sessions/s1/snap", damaged).ok());
  ASSERT_TRUE(backend_->Put("sessions/s1/meta", "m").ok());
  ASSERT_TRUE(backend_->Quarantine("sessions/s1/snap").ok());
  EXPECT_EQ(backend_->Get("sessions/s1/snap").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*backend_->List(""), std::vector<std::string>{"sessions/s1/meta"});  // not live state

  auto kept = backend_->List("quarantine/");
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->size(), 1u);
  EXPECT_TRUE(absl::StartsWith((*kept)[0], "quarantine/sessions/s1/snap.")) << (*kept)[0];
  EXPECT_EQ(*backend_->Get((*kept)[0]), damaged);

  // Again within the second: both copies are kept. Absent keys are fine.
  ASSERT_TRUE(backend_->Put("sessions/s1/snap", "second").ok());
  ASSERT_TRUE(backend_->Quarantine("sessions/s1/snap").ok());
  ASSERT_TRUE(backend_->Put("sessions/s1/snap", "third").ok());
  ASSERT_TRUE(backend_->Quarantine("sessions/s1/snap").ok());
  EXPECT_EQ(backend_->List("quarantine/sessions/s1/")->size(), 3u);
  EXPECT_TRUE(backend_->Quarantine("sessions/s1/snap").ok());
  EXPECT_TRUE(backend_->Quarantine("never/there").ok());
  EXPECT_EQ(backend_->List("quarantine/")->size(), 3u);
}

TEST_P(StateBackendTest, InvalidKeysAreRejected) {
  for (const std::string& key : std::vector<std::string>{"",
                                                         "/abs",
                                                         "trailing/",
                                                         "a//b",
                                                         "a/../b",
                                                         "..",
                                                         ".",
                                                         "a/.",
                                                         ".lock",
                                                         "a/.hidden",
                                                         "dot./x",
                                                         "a..b",
                                                         "sp ace",
                                                         "new\nline",
                                                         "star*",
                                                         "colon:",
                                                         "back\\slash",
                                                         std::string("nul\0", 4),
                                                         std::string(1025, 'a'),
                                                         absl::StrCat(std::string(201, 'a'), "/b")}) {
    SCOPED_TRACE(absl::StrCat("key \"", key, "\""));
    EXPECT_FALSE(IsValidStateKey(key));
    EXPECT_EQ(backend_->Put(key, "v").code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Append(backend_.get(), {{"good", "v"}, {key, "v"}}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(backend_->Get(key).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(backend_->Delete(key).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(backend_->CompareAndSet(key, std::nullopt, "v").status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(backend_->Quarantine(key).code(), absl::StatusCode::kInvalidArgument);
  }
  // A rejected group writes nothing, not even its valid keys.
  EXPECT_EQ(backend_->Get("good").status().code(), absl::StatusCode::kNotFound);
  for (const char* key : {"sessions/0123abcd/meta", "replicas/txl-server-0", "a.b_c-D9", "x.tmp.y", "lock"}) {
    EXPECT_TRUE(IsValidStateKey(key)) << key;
    EXPECT_TRUE(backend_->Put(key, key).ok()) << key;
    EXPECT_EQ(*backend_->Get(key), key);
  }
}

TEST_P(StateBackendTest, DescribeNamesTheStore) {
  const std::string d = backend_->Describe();
  if (GetParam() == Kind::kRedis) {
    EXPECT_EQ(d, absl::StrCat("redis://127.0.0.1:", redis_->port(), "/", prefix_));
  } else {
    EXPECT_EQ(d, absl::StrCat("dir:", dir_.path(), "/state"));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StateBackendTest, ::testing::Values(Kind::kDirectory, Kind::kRedis),
                         [](const auto& info) { return info.param == Kind::kRedis ? "Redis" : "Directory"; });

// --- Opening ---

TEST(OpenStateBackendTest, ParsesFsyncPolicies) {
  EXPECT_EQ(*ParseFsyncPolicy("always"), FsyncPolicy::kAlways);
  EXPECT_EQ(*ParseFsyncPolicy("interval"), FsyncPolicy::kInterval);
  EXPECT_EQ(*ParseFsyncPolicy("never"), FsyncPolicy::kNever);
  for (const char* bad : {"", "Always", "sometimes"}) {
    auto p = ParseFsyncPolicy(bad);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(OpenStateBackendTest, BadSpecsAreInvalidArgumentNamingTheSpec) {
  for (const char* spec :
       {"", "dir:", "ftp://host/x", "redis:host:1", "redis://", "redis://host", "redis://:6379", "redis://host:0",
        "redis://host:70000", "redis://host:port", "redis://h:1/bad prefix", "redis://[::1/x"}) {
    StateBackendConfig config;
    config.spec = spec;
    auto backend = OpenStateBackend(config);
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument) << spec << ": " << backend.status();
    EXPECT_TRUE(absl::StrContains(backend.status().message(), absl::StrCat("\"", spec, "\""))) << backend.status();
  }
}

TEST(OpenStateBackendTest, RedisNobodyListensIsUnavailable) {
  // Bound but not listening: connections are refused, and nobody else can take the port meanwhile.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  StateBackendConfig config = RedisConfig(port, "txl");
  config.redis_timeout = absl::Milliseconds(500);
  auto backend = OpenStateBackend(config);
  close(fd);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
  EXPECT_TRUE(absl::StrContains(backend.status().message(), absl::StrCat("127.0.0.1:", port))) << backend.status();
}

TEST(OpenStateBackendTest, DirectoryUnderARegularFileIsUnavailable) {
  TempDir dir;
  const std::string file = absl::StrCat(dir.path(), "/file");
  std::ofstream(file) << "x";
  StateBackendConfig config;
  config.spec = absl::StrCat(file, "/state");
  auto backend = OpenStateBackend(config);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
  EXPECT_TRUE(absl::StrContains(backend.status().message(), config.spec)) << backend.status();
  config.spec = file;  // the file itself
  EXPECT_EQ(OpenStateBackend(config).status().code(), absl::StatusCode::kUnavailable);
}

TEST(OpenStateBackendTest, PlainAndRelativePathsAreDirectories) {
  TempDir dir;
  StateBackendConfig config;
  config.spec = absl::StrCat(dir.path(), "/a/b/c/");  // created, parents too
  auto backend = OpenStateBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Describe(), absl::StrCat("dir:", dir.path(), "/a/b/c"));

  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  config.spec = "rel";
  backend = OpenStateBackend(config);
  fs::current_path(cwd);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Describe(), absl::StrCat("dir:", dir.path(), "/rel"));
  ASSERT_TRUE((*backend)->Put("k", "v").ok());  // the root is absolute from then on
  EXPECT_TRUE(fs::exists(absl::StrCat(dir.path(), "/rel/k")));
}

// --- The directory backend ---

std::unique_ptr<StateBackend> OpenDir(const std::string& root, FsyncPolicy fsync = FsyncPolicy::kAlways,
                                      absl::Duration interval = absl::Seconds(1), const std::string& writer = "") {
  StateBackendConfig config;
  config.writer = writer;
  config.spec = absl::StrCat("dir:", root);
  config.fsync = fsync;
  config.fsync_interval = interval;
  auto backend = OpenStateBackend(config);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(DirectoryStateBackendTest, KeysAreFilesUnderTheRoot) {
  TempDir dir;
  auto backend = OpenDir(dir.path());
  ASSERT_TRUE(backend->Put("sessions/s1/meta", "meta bytes").ok());
  ASSERT_TRUE(Append(backend.get(), {{"sessions/s1/log", "r1"}, {"sessions/s1/log", "r2"}}).ok());
  EXPECT_EQ(ReadFile(absl::StrCat(dir.path(), "/sessions/s1/meta")), "meta bytes");
  EXPECT_EQ(ReadFile(absl::StrCat(dir.path(), "/sessions/s1/log")), "r1r2");
  // Deleting a session's last key removes its directory too.
  ASSERT_TRUE(backend->Delete("sessions/s1/meta").ok());
  ASSERT_TRUE(backend->Delete("sessions/s1/log").ok());
  EXPECT_FALSE(fs::exists(absl::StrCat(dir.path(), "/sessions")));
  EXPECT_TRUE(fs::exists(absl::StrCat(dir.path(), "/.lock")));
}

TEST(DirectoryStateBackendTest, AKeyUnderAFileKeyFailsNamingTheKey) {
  TempDir dir;
  auto backend = OpenDir(dir.path());
  ASSERT_TRUE(backend->Put("a", "file").ok());
  absl::Status put = backend->Put("a/b", "v");
  EXPECT_FALSE(put.ok());
  EXPECT_TRUE(absl::StrContains(put.message(), "\"a/b\"")) << put;
  EXPECT_TRUE(absl::StrContains(put.message(), "Not a directory")) << put;  // strerror
  EXPECT_FALSE(Append(backend.get(), {{"a/c", "v"}}).ok());
  EXPECT_EQ(*backend->Get("a"), "file");
}

TEST(DirectoryStateBackendTest, TempFilesACrashLeftAreIgnoredThenRemovedOnReopen) {
  TempDir dir;
  auto backend = OpenDir(dir.path(), FsyncPolicy::kAlways, absl::Seconds(1), "r1");
  ASSERT_TRUE(backend->Put("sessions/s1/snap", "complete").ok());
  ASSERT_TRUE(backend->Put("x.tmp.y", "a key that only looks like a temp file").ok());
  // What a Put of this writer killed between write and rename leaves: a temp file beside the key.
  const std::string stale1 = absl::StrCat(dir.path(), "/sessions/s1/.snap.tmp.r1.4242.7");
  const std::string stale2 = absl::StrCat(dir.path(), "/.top.tmp.r1.1.0");
  std::ofstream(stale1) << "torn";
  std::ofstream(stale2) << "torn";
  EXPECT_EQ(*backend->List(""), (std::vector<std::string>{"sessions/s1/snap", "x.tmp.y"}));
  backend.reset();

  backend = OpenDir(dir.path(), FsyncPolicy::kAlways, absl::Seconds(1), "r1");
  EXPECT_FALSE(fs::exists(stale1));
  EXPECT_FALSE(fs::exists(stale2));
  EXPECT_EQ(*backend->Get("sessions/s1/snap"), "complete");
  EXPECT_EQ(*backend->Get("x.tmp.y"), "a key that only looks like a temp file");
  // And a Put leaves no temp file of its own.
  ASSERT_TRUE(backend->Put("sessions/s1/snap", "newer").ok());
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 3);  // snap, x.tmp.y, .lock
}

// Regression: a replica opening a shared directory removed every temp file,
// including another live replica's Put in flight, whose rename then failed.
TEST(DirectoryStateBackendTest, OpeningLeavesOtherWritersTempFilesUnlessOld) {
  TempDir dir;
  auto a = OpenDir(dir.path(), FsyncPolicy::kNever, absl::Seconds(1), "a");
  ASSERT_TRUE(a->Put("sessions/s1/snap", "x").ok());
  const std::string in_flight = absl::StrCat(dir.path(), "/sessions/s1/.snap.tmp.a.77.3");
  const std::string abandoned = absl::StrCat(dir.path(), "/sessions/s1/.log.tmp.c.78.0");
  std::ofstream(in_flight) << "being written by a";
  std::ofstream(abandoned) << "left by c two hours ago";
  const auto two_hours_ago = fs::file_time_type::clock::now() - std::chrono::hours(2);
  fs::last_write_time(abandoned, two_hours_ago);
  auto b = OpenDir(dir.path(), FsyncPolicy::kNever, absl::Seconds(1), "b");
  EXPECT_TRUE(fs::exists(in_flight)) << "a's write in flight was removed by b opening the directory";
  EXPECT_FALSE(fs::exists(abandoned));
}

// Regression: opening the store failed ("state directory: open ...: No such
// file or directory") when another replica removed an emptied session
// directory while the opening one looked for its stale temp files.
TEST(DirectoryStateBackendTest, OpeningWhileAnotherWriterRemovesDirectoriesWorks) {
  TempDir dir;
  auto churn = OpenDir(dir.path(), FsyncPolicy::kNever, absl::Seconds(1), "a");
  constexpr int kSessions = 400;  // each open walks them all: a wide window for the race
  for (int i = 0; i < kSessions; ++i) ASSERT_TRUE(churn->Put(absl::StrCat("sessions/s", i, "/meta"), "m").ok());
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop.load(); ++i) {
      const std::string key = absl::StrCat("sessions/s", i % kSessions, "/meta");
      ASSERT_TRUE(churn->Delete(key).ok());  // removes the emptied directory
      ASSERT_TRUE(churn->Put(key, "m").ok());
    }
  });
  int failures = 0;
  std::string first;
  for (int n = 0; n < 300; ++n) {
    StateBackendConfig config;
    config.spec = absl::StrCat("dir:", dir.path());
    config.fsync = FsyncPolicy::kNever;
    config.writer = "b";
    auto b = OpenStateBackend(config);
    if (!b.ok() && failures++ == 0) first = std::string(b.status().message());
  }
  stop.store(true);
  writer.join();
  EXPECT_EQ(failures, 0) << first;
}

TEST(DirectoryStateBackendTest, EveryFsyncPolicyRoundTrips) {
  for (FsyncPolicy policy : {FsyncPolicy::kAlways, FsyncPolicy::kInterval, FsyncPolicy::kNever}) {
    SCOPED_TRACE(static_cast<int>(policy));
    TempDir dir;
    {
      auto backend = OpenDir(dir.path(), policy, absl::Milliseconds(10));
      ASSERT_TRUE(backend->Put("s/1/snap", "snap").ok());
      ASSERT_TRUE(Append(backend.get(), {{"s/1/log", "a"}, {"s/2/log", "b"}}).ok());
      ASSERT_TRUE(Append(backend.get(), {{"s/1/log", "c"}}).ok());
      EXPECT_TRUE(*backend->CompareAndSet("s/1/holder", std::nullopt, "me"));
      ASSERT_TRUE(backend->Put("s/2/bad", "bad").ok());
      ASSERT_TRUE(backend->Quarantine("s/2/bad").ok());
      ASSERT_TRUE(backend->Delete("s/2/log").ok());
      absl::SleepFor(absl::Milliseconds(30));  // let an interval sync run over these
    }
    auto backend = OpenDir(dir.path(), FsyncPolicy::kNever);
    EXPECT_EQ(*backend->Get("s/1/snap"), "snap");
    EXPECT_EQ(*backend->Get("s/1/log"), "ac");
    EXPECT_EQ(*backend->Get("s/1/holder"), "me");
    EXPECT_EQ(*backend->List(""), (std::vector<std::string>{"s/1/holder", "s/1/log", "s/1/snap"}));
    EXPECT_EQ(backend->List("quarantine/")->size(), 1u);
  }
}

TEST(DirectoryStateBackendTest, IntervalSyncerStopsPromptly) {
  TempDir dir;
  // An hour between syncs: the destructor must wake the syncer, not wait it out.
  auto backend = OpenDir(dir.path(), FsyncPolicy::kInterval, absl::Hours(1));
  ASSERT_TRUE(backend->Put("k", "v").ok());
  ASSERT_TRUE(Append(backend.get(), {{"log", "x"}}).ok());
  const absl::Time start = absl::Now();
  backend.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // Busy syncing every millisecond while writers run, then stopped.
  backend = OpenDir(dir.path(), FsyncPolicy::kInterval, absl::Milliseconds(1));
  std::vector<std::thread> writers;
  for (int i = 0; i < 4; ++i) {
    writers.emplace_back([&backend, i] {
      for (int n = 0; n < 50; ++n) ASSERT_TRUE(Append(backend.get(), {{absl::StrCat("w/", i), "x"}}).ok());
    });
  }
  for (auto& t : writers) t.join();
  backend.reset();
  backend = OpenDir(dir.path(), FsyncPolicy::kNever);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(*backend->Get(absl::StrCat("w/", i)), std::string(50, 'x'));
}

TEST(DirectoryStateBackendTest, IntervalMustBePositive) {
  TempDir dir;
  StateBackendConfig config;
  config.spec = dir.path();
  config.fsync = FsyncPolicy::kInterval;
  config.fsync_interval = absl::ZeroDuration();
  EXPECT_EQ(OpenStateBackend(config).status().code(), absl::StatusCode::kInvalidArgument);
}

// --- The Redis backend ---

TEST(RedisStateBackendTest, PrefixesSeparateKeySpaces) {
  ASSERT_TRUE(RedisServer::Installed()) << kRedisServer << " is missing: scripts/install-deps.sh installs it";
  std::string error;
  auto server = RedisServer::Start(0, &error);
  ASSERT_NE(server, nullptr) << error;
  auto a = OpenStateBackend(RedisConfig(server->port(), "a"));
  auto b = OpenStateBackend(RedisConfig(server->port(), "b"));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Put("k", "in a").ok());
  EXPECT_EQ((*b)->Get("k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*b)->List("")->empty());

  StateBackendConfig config;
  config.spec = absl::StrCat("redis://127.0.0.1:", server->port());  // the default prefix
  auto plain = OpenStateBackend(config);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->Describe(), absl::StrCat("redis://127.0.0.1:", server->port(), "/txl"));
}

TEST(RedisStateBackendTest, ReconnectsAfterTheServerRestarts) {
  ASSERT_TRUE(RedisServer::Installed()) << kRedisServer << " is missing: scripts/install-deps.sh installs it";
  std::string error;
  auto server = RedisServer::Start(0, &error);
  ASSERT_NE(server, nullptr) << error;
  const int port = server->port();
  auto backend = OpenStateBackend(RedisConfig(port, "txl"));
  ASSERT_TRUE(backend.ok()) << backend.status();
  ASSERT_TRUE((*backend)->Put("k", "v").ok());

  server->Kill();
  EXPECT_EQ((*backend)->Get("k").status().code(), absl::StatusCode::kUnavailable);
  absl::Status down = Append(backend->get(), {{"log", "x"}});
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(down.message(), absl::StrCat("127.0.0.1:", port))) << down;

  server = RedisServer::Start(port, &error);  // empty again: no persistence
  ASSERT_NE(server, nullptr) << error;
  EXPECT_EQ((*backend)->Get("k").status().code(), absl::StatusCode::kNotFound);
  // The old connection is dead after a restart: even the unsafe-to-resend
  // commands reconnect first rather than fail.
  ASSERT_TRUE((*backend)->Put("k", "v2").ok());
  server->Kill();
  server = RedisServer::Start(port, &error);
  ASSERT_NE(server, nullptr) << error;
  EXPECT_TRUE(Append(backend->get(), {{"log", "x"}}).ok());
  server->Kill();
  server = RedisServer::Start(port, &error);
  ASSERT_NE(server, nullptr) << error;
  EXPECT_TRUE(*(*backend)->CompareAndSet("claim", std::nullopt, "me"));
}

// Why the journal guards its writes and reads back unknown outcomes: a
// write sent to a server that hangs times out (UNKNOWN, not UNAVAILABLE:
// it may land) and lands once the server comes back.
TEST(RedisStateBackendTest, AWriteToAPausedServerIsUnknownAndLandsLate) {
  ASSERT_TRUE(RedisServer::Installed()) << kRedisServer << " is missing: scripts/install-deps.sh installs it";
  std::string error;
  auto server = RedisServer::Start(0, &error);
  ASSERT_NE(server, nullptr) << error;
  StateBackendConfig config = RedisConfig(server->port(), "txl");
  config.redis_timeout = absl::Milliseconds(300);
  auto backend = OpenStateBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status();
  ASSERT_TRUE((*backend)->Put("log", "ab").ok());
  const StoreGuard two{StoreGuard::kLength, "log", {}, 2};

  server->Pause();
  std::vector<int> outcomes;
  absl::Status sent = (*backend)->Write({{"append", {two}, {{StoreMutation::kAppend, "log", "c"}}}}, &outcomes);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnknown) << sent;
  EXPECT_EQ(outcomes, (std::vector<int>{kWriteUnknown}));
  server->Resume();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::StatusOr<std::string> log;
  do {
    log = (*backend)->Get("log");
  } while (log.ok() && *log == "ab" && absl::Now() < deadline);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(*log, "abc") << "the write sent before the pause lands after it";
  // A second copy of it is refused by its guard: the log moved on.
  absl::Status again = (*backend)->Write({{"append", {two}, {{StoreMutation::kAppend, "log", "c"}}}}, &outcomes);
  ASSERT_TRUE(again.ok()) << again;
  EXPECT_EQ(outcomes, (std::vector<int>{0}));
  EXPECT_EQ(*(*backend)->Get("log"), "abc");
}

}  // namespace
}  // namespace txl
