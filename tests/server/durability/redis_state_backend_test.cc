// The Redis state backend against a real redis-server on loopback: key-space
// prefixes, reconnecting after a restart, and a write to a paused server.
#include "server/durability/state_backend.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/server/durability/state_backend_fixture.h"

namespace txl {
namespace {

using testing::Append;
using testing::kRedisServer;
using testing::RedisConfig;
using testing::RedisServer;

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
