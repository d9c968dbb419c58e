#include "server/sessions/session_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "tests/server/fake_engine.h"

namespace txl {
namespace {

std::unique_ptr<SessionState> State(int64_t mem_len = 32) { return std::make_unique<testing::FakeSession>(mem_len); }
// The model version every session here is bound to.
const std::shared_ptr<ServedModel>& Model() {
  static const auto* model = new std::shared_ptr<ServedModel>(testing::FakeServed());
  return *model;
}

// The per-principal and per-model counts keep no entry at zero: a map of
// every principal that ever held a session would grow without bound.
TEST(KeyCountsTest, AKeyBackAtZeroLeavesNoEntry) {
  KeyCounts counts;
  EXPECT_EQ(counts.Count("alice"), 0);
  counts.Add("alice", +1);
  counts.Add("alice", +1);
  counts.Add("bob", +1);
  EXPECT_EQ(counts.Count("alice"), 2);
  EXPECT_EQ(counts.keys(), 2);
  counts.Add("alice", -2);
  EXPECT_EQ(counts.Count("alice"), 0);
  EXPECT_EQ(counts.keys(), 1);
  counts.Add("bob", -1);
  EXPECT_EQ(counts.keys(), 0);
}

TEST(SessionTableTest, IdsAreLongRandomAndUnique) {
  SessionTable table({});
  std::set<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    auto info = table.Create("", Model(), State(), absl::ZeroDuration(), {}, absl::Now());
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->id.size(), 32u);  // 128 bits, hex
    ids.insert(info->id);
  }
  EXPECT_EQ(ids.size(), 200u);
}

TEST(SessionTableTest, ClientChosenIdIsKeptAndCannotBeTakenTwice) {
  SessionTable table({});
  const std::string id = "0123456789abcdef0123456789abcdef";
  auto first = table.Create("", Model(), State(), absl::ZeroDuration(), {}, absl::Now(), id);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->id, id);
  auto again = table.Create("", Model(), State(), absl::ZeroDuration(), {}, absl::Now(), id);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(table.size(), 1);
}

TEST(SessionTableTest, BusySessionIsAbortedAndUnchanged) {
  SessionTable table({});
  auto info = table.Create("", Model(), State(), absl::ZeroDuration(), {{"team", "a"}}, absl::Now());
  auto lease = table.Acquire("", info->id, absl::Now());
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE(table.Get("", info->id)->busy);
  EXPECT_EQ(table.Acquire("", info->id, absl::Now()).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(table.Delete("", info->id).code(), absl::StatusCode::kAborted);
  static_cast<testing::FakeSession*>(lease->state.get())->history = {1, 2, 3};
  lease->pending = {4};
  table.Release(*std::move(lease), absl::Now());
  auto after = table.Get("", info->id);
  EXPECT_FALSE(after->busy);
  EXPECT_EQ(after->position, 4);
  EXPECT_EQ(after->labels.at("team"), "a");
  EXPECT_TRUE(table.Delete("", info->id).ok());
  EXPECT_EQ(table.Get("", info->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Delete("", info->id).code(), absl::StatusCode::kNotFound);
}

// A version whose destructor asks the table something from another thread:
// if the table's lock were held while the version is freed, that thread
// could not get it, and `held` counts it.
class WatchedVersion final : public ServedModel {
 public:
  WatchedVersion(const SessionTable* table, std::atomic<int>* held, std::vector<std::thread>* probes)
      : ServedModel("watched", 1, std::make_unique<testing::FakeEngine>(256), ModelConfig(), Tokenizer::Byte()),
        table_(table),
        held_(held),
        probes_(probes) {}
  ~WatchedVersion() override {
    auto answered = std::make_shared<std::atomic<bool>>(false);
    probes_->emplace_back([table = table_, answered] {
      (void)table->size();
      *answered = true;
    });
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    while (!*answered && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    if (!*answered) ++*held_;
  }

 private:
  const SessionTable* table_;
  std::atomic<int>* held_;
  std::vector<std::thread>* probes_;
};

TEST(SessionTableTest, TheLastSessionOfAVersionFreesItOutsideTheTablesLock) {
  SessionTable table({});
  std::atomic<int> held{0};
  std::vector<std::thread> probes;  // joined once the table's lock is free again
  auto session = [&] {
    auto info = table.Create("", std::make_shared<WatchedVersion>(&table, &held, &probes), State(), absl::Seconds(1),
                             {}, absl::Now());
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->id : "";
  };
  EXPECT_TRUE(table.Delete("", session()).ok());
  auto lease = table.Acquire("", session(), absl::Now());
  ASSERT_TRUE(lease.ok());
  table.Discard(*std::move(lease));
  session();
  EXPECT_EQ(table.ExpireIdle(absl::Now() + absl::Hours(1), nullptr), 1);
  for (std::thread& t : probes) t.join();
  EXPECT_EQ(probes.size(), 3u);  // each version was freed, by its last session's end
  EXPECT_EQ(held, 0);
}

TEST(SessionTableTest, MaxSessionsIsResourceExhausted) {
  SessionTableConfig config;
  config.max_sessions = 2;
  SessionTable table(config);
  ASSERT_TRUE(table.Create("", Model(), State(), absl::ZeroDuration(), {}, absl::Now()).ok());
  ASSERT_TRUE(table.Create("", Model(), State(), absl::ZeroDuration(), {}, absl::Now()).ok());
  auto third = table.Create("", Model(), State(), absl::ZeroDuration(), {}, absl::Now());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("max_sessions=2"), std::string::npos);
}

// A model's limits.json max_sessions counts its versions' sessions together,
// leaves other models alone, and frees a place when a session ends.
TEST(SessionTableTest, AModelsOwnMaxSessionsCountsAllItsVersions) {
  SessionTable table({});
  ModelLimits two;
  two.max_sessions = 2;
  auto version = [&](const std::string& name, int64_t v, ModelLimits limits) {
    return std::make_shared<ServedModel>(name, v, std::make_unique<testing::FakeEngine>(256), ModelConfig(),
                                         Tokenizer::Byte(), "", limits);
  };
  auto beta1 = version("beta", 1, two);
  auto beta2 = version("beta", 2, two);
  auto alpha = version("alpha", 1, {});
  auto first = table.Create("", beta1, State(), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(table.Create("", beta2, State(), absl::ZeroDuration(), {}, absl::Now()).ok());
  auto third = table.CreateAcquired("", beta2, State(), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("session limit of model beta reached (its limits.json max_sessions=2)"),
            std::string::npos)
      << third.status();
  EXPECT_TRUE(table.Create("", alpha, State(), absl::ZeroDuration(), {}, absl::Now()).ok());
  EXPECT_EQ(table.size(), 3u);
  ASSERT_TRUE(table.Delete("", first->id).ok());
  EXPECT_TRUE(table.Create("", beta1, State(), absl::ZeroDuration(), {}, absl::Now()).ok());
}

TEST(SessionTableTest, MemoryBudgetReservesFullWindowsAndFreesThem) {
  SessionTableConfig config;
  config.memory_budget_bytes = 2 * (9 - 1) * 8;  // two fake sessions of mem_len 9
  SessionTable table(config);
  auto a = table.Create("", Model(), State(9), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(table.reserved_bytes(), 64);
  EXPECT_EQ(table.memory_bytes(), 0);  // reserved, not yet filled
  auto b = table.CreateAcquired("", Model(), State(9), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(b.ok());
  auto third = table.Create("", Model(), State(2), absl::ZeroDuration(), {}, absl::Now());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("session_memory_budget=128"), std::string::npos) << third.status();
  EXPECT_EQ(table.size(), 2);
  // Every way out of the store gives the reservation back.
  table.Discard(*std::move(b));
  EXPECT_EQ(table.reserved_bytes(), 64);
  ASSERT_TRUE(table.Delete("", a->id).ok());
  EXPECT_EQ(table.reserved_bytes(), 0);
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(table.Create("", Model(), State(9), absl::Seconds(1), {}, t0).ok());
  ASSERT_TRUE(table.Create("", Model(), State(9), absl::Seconds(1), {}, t0).ok());
  EXPECT_EQ(table.ExpireIdle(t0 + absl::Seconds(2)), 2);
  EXPECT_EQ(table.reserved_bytes(), 0);
  EXPECT_TRUE(table.Create("", Model(), State(9), absl::ZeroDuration(), {}, absl::Now()).ok());
}

// Sessions read back from the state store (a restart) count their windows
// against the budget as their restores begin (BringBack), and only within
// it: with room for one of two asked for together, the first comes back and
// the second is refused, staying where it was; new sessions are refused
// while the first is there. Before, a recovered session counted nothing
// until its request ended, so admission let sessions in past the budget.
TEST(SessionTableTest, RecoveredSessionsCountTheirWindowsAsTheyComeBackAndOnlyWithinTheBudget) {
  SessionTableConfig config;
  config.memory_budget_bytes = 2 * (9 - 1) * 8;  // two fake sessions of mem_len 9
  SessionTable table(config);
  for (const char* id : {"r1", "r2"}) {
    auto idle = std::make_shared<IdleSession>();
    idle->mem_len = 9;
    ASSERT_TRUE(
        table.AddIdle(id, "", Model(), absl::ZeroDuration(), {}, absl::Now(), idle, {}, 0, 0, TokenHistory()).ok());
  }
  EXPECT_EQ(table.reserved_bytes(), 0) << "out of device memory";
  ASSERT_TRUE(table.Create("", Model(), State(9), absl::ZeroDuration(), {}, absl::Now()).ok());
  auto r1 = table.Acquire("", "r1", absl::Now());
  auto r2 = table.Acquire("", "r2", absl::Now());
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(table.reserved_bytes(), 64) << "acquired, not yet brought back";
  ASSERT_TRUE(table.BringBack("r1").ok());
  EXPECT_EQ(table.reserved_bytes(), 128);
  const absl::Status full = table.BringBack("r2");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("back into device memory"), std::string::npos) << full;
  EXPECT_EQ(table.Create("", Model(), State(9), absl::ZeroDuration(), {}, absl::Now()).status().code(),
            absl::StatusCode::kResourceExhausted);
  table.Release(*std::move(r2), absl::Now());  // not restored: still out of device memory
  EXPECT_EQ(table.reserved_bytes(), 128);
  r1->state = State(9);  // restored
  table.Release(*std::move(r1), absl::Now());
  EXPECT_EQ(table.reserved_bytes(), 128);
  ASSERT_TRUE(table.Delete("", "r1").ok());
  EXPECT_EQ(table.reserved_bytes(), 64);
  auto again = table.Acquire("", "r2", absl::Now());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(table.BringBack("r2").ok()) << "room again";
  EXPECT_EQ(table.reserved_bytes(), 128);
}

TEST(SessionTableTest, TtlIsBoundedAndIdleSessionsExpire) {
  SessionTableConfig config;
  config.default_ttl = absl::Seconds(10);
  config.max_ttl = absl::Seconds(60);
  SessionTable table(config);
  EXPECT_EQ(table.Create("", Model(), State(), absl::Seconds(61), {}, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Time t0 = absl::Now();
  auto short_lived = table.Create("", Model(), State(), absl::Seconds(5), {}, t0);
  auto defaulted = table.Create("", Model(), State(), absl::ZeroDuration(), {}, t0);
  auto busy = table.Create("", Model(), State(), absl::Seconds(5), {}, t0);
  EXPECT_EQ(defaulted->idle_ttl, absl::Seconds(10));
  auto lease = table.Acquire("", busy->id, t0);
  EXPECT_EQ(table.ExpireIdle(t0 + absl::Seconds(4)), 0);
  EXPECT_EQ(table.ExpireIdle(t0 + absl::Seconds(6)), 1);  // short_lived; busy is spared
  EXPECT_FALSE(table.Get("", short_lived->id).ok());
  EXPECT_TRUE(table.Get("", busy->id).ok());
  EXPECT_EQ(table.ExpireIdle(t0 + absl::Seconds(11)), 1);  // defaulted
  table.Release(*std::move(lease), t0 + absl::Seconds(11));
  EXPECT_EQ(table.ExpireIdle(t0 + absl::Seconds(12)), 0);  // last used just now
}

// Another principal's session must look exactly like an id that does not
// exist, whatever the call, and the calls must leave it as it was.
TEST(SessionTableTest, OtherPrincipalsSessionIsNotFoundEverywhere) {
  SessionTable table({});
  const absl::Time t0 = absl::Now();
  auto mine = table.Create("alice", Model(), State(), absl::ZeroDuration(), {{"team", "a"}}, t0);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->owner, "alice");
  {  // give it some history
    auto lease = table.Acquire("alice", mine->id, t0);
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->owner, "alice");
    static_cast<testing::FakeSession*>(lease->state.get())->history = {1, 2};
    lease->pending = {3};
    table.Release(*std::move(lease), t0);
  }
  const std::string unknown = "0123456789abcdef0123456789abcdef";
  for (const std::string& other : {std::string("bob"), std::string("")}) {
    SCOPED_TRACE(other);
    const absl::Status expected = table.Get(other, unknown).status();
    ASSERT_EQ(expected.code(), absl::StatusCode::kNotFound);
    const auto same_as_unknown = [&](const absl::Status& s, const std::string& id) {
      EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
      // The message differs from an unknown id's only by the id itself.
      EXPECT_EQ(s.message(),
                std::string(expected.message()).replace(expected.message().find(unknown), unknown.size(), id));
    };
    same_as_unknown(table.Get(other, mine->id).status(), mine->id);
    same_as_unknown(table.Acquire(other, mine->id, t0 + absl::Seconds(5)).status(), mine->id);
    same_as_unknown(table.Delete(other, mine->id), mine->id);
    EXPECT_TRUE(table.List(other).empty());
  }
  // Even while busy, the others get NOT_FOUND, not ABORTED (which would tell that it exists).
  auto busy = table.Acquire("alice", mine->id, t0);
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(table.Acquire("bob", mine->id, t0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Delete("bob", mine->id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Acquire("alice", mine->id, t0).status().code(), absl::StatusCode::kAborted);
  table.Release(*std::move(busy), t0);
  auto after = table.Get("alice", mine->id);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->position, 3);
  EXPECT_EQ(after->last_used, t0);  // the others' attempts did not touch it
  EXPECT_EQ(after->labels.at("team"), "a");
  ASSERT_EQ(table.List("alice").size(), 1u);
  EXPECT_EQ(table.List("alice")[0].id, mine->id);
  EXPECT_TRUE(table.Delete("alice", mine->id).ok());
}

TEST(SessionTableTest, ListShowsEachPrincipalItsOwnSessions) {
  SessionTable table({});
  auto a1 = table.Create("alice", Model(), State(), absl::ZeroDuration(), {}, absl::Now());
  auto a2 = table.CreateAcquired("alice", Model(), State(), absl::ZeroDuration(), {}, absl::Now());
  auto b1 = table.Create("bob", Model(), State(), absl::ZeroDuration(), {}, absl::Now());
  auto anon = table.Create("", Model(), State(), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(a1.ok() && a2.ok() && b1.ok() && anon.ok());
  std::set<std::string> alice;
  for (const SessionInfo& s : table.List("alice")) alice.insert(s.id);
  EXPECT_EQ(alice, (std::set<std::string>{a1->id, a2->id}));
  ASSERT_EQ(table.List("bob").size(), 1u);
  EXPECT_EQ(table.List("bob")[0].id, b1->id);
  ASSERT_EQ(table.List("").size(), 1u);
  EXPECT_EQ(table.List("")[0].id, anon->id);
  EXPECT_TRUE(table.List("carol").empty());
  EXPECT_EQ(table.size(), 4);
}

TEST(SessionTableTest, PerPrincipalLimitCountsEachPrincipalApart) {
  SessionTableConfig config;
  config.max_sessions_per_principal = 2;
  SessionTable table(config);
  auto a1 = table.Create("alice", Model(), State(), absl::ZeroDuration(), {}, absl::Now());
  auto a2 = table.CreateAcquired("alice", Model(), State(), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = table.Create("alice", Model(), State(), absl::ZeroDuration(), {}, absl::Now());
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a3.status().message().find("max_sessions_per_principal=2"), std::string::npos) << a3.status();
  EXPECT_TRUE(table.Create("bob", Model(), State(), absl::ZeroDuration(), {}, absl::Now()).ok());
  // Every way out gives the slot back: discard, delete, expiry.
  table.Discard(*std::move(a2));
  auto a4 = table.Create("alice", Model(), State(), absl::Seconds(1), {}, absl::Now());
  ASSERT_TRUE(a4.ok()) << a4.status();
  ASSERT_TRUE(table.Delete("alice", a1->id).ok());
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(table.Create("alice", Model(), State(), absl::Seconds(1), {}, t0).ok());
  EXPECT_EQ(table.Create("alice", Model(), State(), absl::ZeroDuration(), {}, t0).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table.ExpireIdle(t0 + absl::Hours(1)), 3);  // alice's two, and bob's (default ttl 10 min)
  EXPECT_TRUE(table.Create("alice", Model(), State(), absl::ZeroDuration(), {}, t0).ok());
  EXPECT_TRUE(table.Create("alice", Model(), State(), absl::ZeroDuration(), {}, t0).ok());
}

}  // namespace
}  // namespace txl
