// StateBackend (server/durability/state_backend.h): one suite run against both the
// directory backend and a real redis-server on loopback. What is particular to
// each: directory_state_backend_test.cc, redis_state_backend_test.cc; opening a
// store from its spec: state_backend_open_test.cc.
#include "server/durability/state_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "tests/server/durability/state_backend_fixture.h"

namespace txl {
namespace {

using testing::Append;
using testing::kRedisServer;
using testing::RedisConfig;
using testing::RedisServer;
using testing::TempDir;

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

}  // namespace
}  // namespace txl
