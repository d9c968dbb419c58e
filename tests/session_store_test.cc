#include "server/session_store.h"

#include <gtest/gtest.h>

#include <set>

#include "tests/fake_engine.h"

namespace txl {
namespace {

std::unique_ptr<EngineSession> State(int64_t mem_len = 32) {
  return std::make_unique<testing::FakeSession>(mem_len);
}

TEST(SessionStoreTest, IdsAreLongRandomAndUnique) {
  SessionStore store({});
  std::set<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    auto info = store.Create(State(), absl::ZeroDuration(), {}, absl::Now());
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->id.size(), 32u);  // 128 bits, hex
    ids.insert(info->id);
  }
  EXPECT_EQ(ids.size(), 200u);
}

TEST(SessionStoreTest, ClientChosenIdIsKeptAndCannotBeTakenTwice) {
  SessionStore store({});
  const std::string id = "0123456789abcdef0123456789abcdef";
  auto first = store.Create(State(), absl::ZeroDuration(), {}, absl::Now(), id);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->id, id);
  auto again = store.Create(State(), absl::ZeroDuration(), {}, absl::Now(), id);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store.size(), 1);
}

TEST(SessionStoreTest, BusySessionIsAbortedAndUnchanged) {
  SessionStore store({});
  auto info = store.Create(State(), absl::ZeroDuration(), {{"team", "a"}}, absl::Now());
  auto lease = store.Acquire(info->id, absl::Now());
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE(store.Get(info->id)->busy);
  EXPECT_EQ(store.Acquire(info->id, absl::Now()).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store.Delete(info->id).code(), absl::StatusCode::kAborted);
  static_cast<testing::FakeSession*>(lease->state.get())->history = {1, 2, 3};
  lease->pending = {4};
  store.Release(*std::move(lease), absl::Now());
  auto after = store.Get(info->id);
  EXPECT_FALSE(after->busy);
  EXPECT_EQ(after->position, 4);
  EXPECT_EQ(after->labels.at("team"), "a");
  EXPECT_TRUE(store.Delete(info->id).ok());
  EXPECT_EQ(store.Get(info->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Delete(info->id).code(), absl::StatusCode::kNotFound);
}

TEST(SessionStoreTest, MaxSessionsIsResourceExhausted) {
  SessionStoreConfig config;
  config.max_sessions = 2;
  SessionStore store(config);
  ASSERT_TRUE(store.Create(State(), absl::ZeroDuration(), {}, absl::Now()).ok());
  ASSERT_TRUE(store.Create(State(), absl::ZeroDuration(), {}, absl::Now()).ok());
  auto third = store.Create(State(), absl::ZeroDuration(), {}, absl::Now());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("max_sessions=2"), std::string::npos);
}

TEST(SessionStoreTest, MemoryBudgetReservesFullWindowsAndFreesThem) {
  SessionStoreConfig config;
  config.memory_budget_bytes = 2 * (9 - 1) * 8;  // two fake sessions of mem_len 9
  SessionStore store(config);
  auto a = store.Create(State(9), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(store.reserved_bytes(), 64);
  EXPECT_EQ(store.memory_bytes(), 0);  // reserved, not yet filled
  auto b = store.CreateAcquired(State(9), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(b.ok());
  auto third = store.Create(State(2), absl::ZeroDuration(), {}, absl::Now());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("session_memory_budget=128"), std::string::npos) << third.status();
  EXPECT_EQ(store.size(), 2);
  // Every way out of the store gives the reservation back.
  store.Discard(*std::move(b));
  EXPECT_EQ(store.reserved_bytes(), 64);
  ASSERT_TRUE(store.Delete(a->id).ok());
  EXPECT_EQ(store.reserved_bytes(), 0);
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(store.Create(State(9), absl::Seconds(1), {}, t0).ok());
  ASSERT_TRUE(store.Create(State(9), absl::Seconds(1), {}, t0).ok());
  EXPECT_EQ(store.ExpireIdle(t0 + absl::Seconds(2)), 2);
  EXPECT_EQ(store.reserved_bytes(), 0);
  EXPECT_TRUE(store.Create(State(9), absl::ZeroDuration(), {}, absl::Now()).ok());
}

TEST(SessionStoreTest, TtlIsBoundedAndIdleSessionsExpire) {
  SessionStoreConfig config;
  config.default_ttl = absl::Seconds(10);
  config.max_ttl = absl::Seconds(60);
  SessionStore store(config);
  EXPECT_EQ(store.Create(State(), absl::Seconds(61), {}, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Time t0 = absl::Now();
  auto short_lived = store.Create(State(), absl::Seconds(5), {}, t0);
  auto defaulted = store.Create(State(), absl::ZeroDuration(), {}, t0);
  auto busy = store.Create(State(), absl::Seconds(5), {}, t0);
  EXPECT_EQ(defaulted->idle_ttl, absl::Seconds(10));
  auto lease = store.Acquire(busy->id, t0);
  EXPECT_EQ(store.ExpireIdle(t0 + absl::Seconds(4)), 0);
  EXPECT_EQ(store.ExpireIdle(t0 + absl::Seconds(6)), 1);  // short_lived; busy is spared
  EXPECT_FALSE(store.Get(short_lived->id).ok());
  EXPECT_TRUE(store.Get(busy->id).ok());
  EXPECT_EQ(store.ExpireIdle(t0 + absl::Seconds(11)), 1);  // defaulted
  store.Release(*std::move(lease), t0 + absl::Seconds(11));
  EXPECT_EQ(store.ExpireIdle(t0 + absl::Seconds(12)), 0);  // last used just now
}

}  // namespace
}  // namespace txl
