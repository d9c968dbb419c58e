// Rewinds and forks at a position through the scheduler, against the fake
// engine: each equals a fresh replay of the history up to it, served from a
// turn checkpoint where one is kept, by replay otherwise.
#include "server/batching/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tests/server/batching/scheduler_fixture.h"
#include "tests/server/fake_engine.h"
#include "tests/server/job_outcome.h"

namespace txl {
namespace {

using testing::FakeSession;
using testing::Outcome;
using testing::SchedulerTest;

// Counts OnRewind by how it was served.
struct RewindCounter : SchedulerObserver {
  void OnRewind(const char* how, int64_t n, double) override {
    absl::MutexLock lock(&mu);
    served[how]++;
    replayed += n;
  }
  int count(const std::string& how) {
    absl::MutexLock lock(&mu);
    return served[how];
  }
  absl::Mutex mu;
  std::map<std::string, int> served ABSL_GUARDED_BY(mu);
  int64_t replayed ABSL_GUARDED_BY(mu) = 0;
};

class RewindTest : public SchedulerTest {
 protected:
  // The scheduler (the base's) goes first: its engine thread uses the table and the observer below.
  void TearDown() override { scheduler_.reset(); }
  void MakeWith(SessionTableConfig tc) {
    table_ptr_ = std::make_unique<SessionTable>(tc);
    scheduler_ = std::make_unique<Scheduler>(SchedulerConfig{}, table_ptr_.get(), &counter_);
    scheduler_->Start();
  }
  SessionTable& table() { return table_ptr_ ? *table_ptr_ : table_; }
  std::string New(int64_t mem_len = 64) {
    auto info = table().Create("", served_, *engine_.NewSession(mem_len), absl::ZeroDuration(), {}, absl::Now());
    EXPECT_TRUE(info.ok()) << info.status();
    return info->id;
  }
  SessionLease Take(const std::string& id) {
    auto lease = table().Acquire("", id, absl::Now());
    EXPECT_TRUE(lease.ok()) << lease.status();
    return *std::move(lease);
  }
  std::vector<int> Hist(const std::string& id) {
    auto lease = Take(id);
    std::vector<int> h = static_cast<FakeSession*>(lease.state.get())->history;
    h.insert(h.end(), lease.pending.begin(), lease.pending.end());
    table().Release(std::move(lease), absl::Now());
    return h;
  }
  void Turn(const std::string& id, std::vector<int> input, int n) {
    Outcome o;
    ASSERT_TRUE(scheduler_->SubmitGenerate(Take(id), Spec(std::move(input), n), o.Callbacks()).ok());
    o.Wait();
    ASSERT_TRUE(o.status.ok()) << o.status;
  }
  absl::Status Rewind(const std::string& id, int64_t position) {
    Outcome o;
    auto job = scheduler_->SubmitRewind(Take(id), position, o.Ended());
    if (!job.ok()) return job.status();
    o.Wait();
    return o.status;
  }
  absl::StatusOr<std::string> ForkAt(const std::string& id, int64_t position) {
    Outcome o;
    auto job = scheduler_->SubmitFork(Take(id), absl::ZeroDuration(), {}, position, o.Made());
    if (!job.ok()) return job.status();
    o.Wait();
    if (!o.status.ok()) return o.status;
    return o.made.id;
  }
  static std::vector<int> Prefix(const std::vector<int>& h, int64_t n) { return {h.begin(), h.begin() + n}; }

  RewindCounter counter_;
  std::unique_ptr<SessionTable> table_ptr_;
};

// The fake session's state is its fed history, so "equals a fresh session fed
// the first p tokens" is checked exactly: the state holds p - 1 of them and
// the last is pending, as after a Score that committed them.
TEST_F(RewindTest, ForkAtEveryPositionEqualsAFreshReplayAndLeavesTheSource) {
  SessionTableConfig tc;
  tc.checkpoints.budget_bytes = 0;  // replay only
  MakeWith(tc);
  const std::string id = New();
  Turn(id, {10, 11, 12}, 4);
  Turn(id, {40}, 3);
  Turn(id, {}, 5);
  const std::vector<int> h = Hist(id);
  ASSERT_EQ(h.size(), 16u);
  for (int64_t p = 1; p <= 16; ++p) {
    auto fork = ForkAt(id, p);
    ASSERT_TRUE(fork.ok()) << p << ": " << fork.status();
    EXPECT_EQ(Hist(*fork), Prefix(h, p)) << p;
    EXPECT_EQ(table().Get("", *fork)->position, p);
    auto lease = Take(*fork);
    EXPECT_EQ(lease.pending.size(), 1u) << p;
    EXPECT_EQ(lease.history.start(), 0);
    EXPECT_EQ(lease.history.Slice(0, p), Prefix(h, p));
    table().Release(std::move(lease), absl::Now());
  }
  EXPECT_EQ(Hist(id), h) << "the source is unchanged";
  EXPECT_EQ(counter_.count("checkpoint"), 0);
}

TEST_F(RewindTest, RewindThenGenerateGoesOnFromThePositionAndForgetsTheRest) {
  MakeWith(SessionTableConfig{});
  const std::string id = New();
  Turn(id, {1, 2}, 3);  // 1 2 3 4 5
  Turn(id, {9}, 2);     // 9 10 11
  const std::vector<int> h = Hist(id);
  ASSERT_TRUE(Rewind(id, 3).ok());
  EXPECT_EQ(table().Get("", id)->position, 3);
  EXPECT_EQ(Hist(id), Prefix(h, 3));
  Turn(id, {70}, 2);
  EXPECT_EQ(Hist(id), (std::vector<int>{1, 2, 3, 70, 71, 72}));
  // Rewinding to where it is changes nothing; to 0 empties it.
  ASSERT_TRUE(Rewind(id, 6).ok());
  EXPECT_EQ(table().Get("", id)->position, 6);
  ASSERT_TRUE(Rewind(id, 0).ok());
  EXPECT_EQ(table().Get("", id)->position, 0);
  EXPECT_TRUE(Hist(id).empty());
}

TEST_F(RewindTest, GoingBackATurnIsServedFromItsCheckpointWithoutReplay) {
  MakeWith(SessionTableConfig{});
  const std::string id = New();
  Turn(id, {1, 2}, 3);  // ends at 5 (state 4 + pending)
  Turn(id, {9}, 2);     // ends at 8
  Turn(id, {20}, 2);    // ends at 11
  const std::vector<int> h = Hist(id);
  EXPECT_GT(table().checkpoints().bytes(), 0);
  ASSERT_TRUE(Rewind(id, 8).ok());  // the end of the second turn
  EXPECT_EQ(counter_.count("checkpoint"), 1);
  EXPECT_EQ(Hist(id), Prefix(h, 8));
  ASSERT_TRUE(Rewind(id, 6).ok());  // between turns: the nearest checkpoint (5), then replay
  EXPECT_EQ(counter_.count("replay"), 1);
  EXPECT_EQ(Hist(id), Prefix(h, 6));
  // The checkpoints past the rewind belong to a history that is gone.
  for (const TurnCheckpoint& c : table().checkpoints().Of(id)) EXPECT_LE(c.position, 6);
}

TEST_F(RewindTest, PositionsNotReachableAreOutOfRangeAndNameTheEarliestAndChangeNothing) {
  SessionTableConfig tc;
  tc.history_tokens = 6;
  tc.checkpoints.budget_bytes = 0;
  MakeWith(tc);
  const std::string id = New();
  Turn(id, {1, 2, 3, 4, 5, 6, 7, 8}, 4);  // 12 tokens; memory keeps 6..11
  const std::vector<int> h = Hist(id);
  absl::Status s = Rewind(id, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("earliest position it can go back to is 12"), std::string::npos) << s;
  EXPECT_EQ(Hist(id), h);
  s = Rewind(id, 13);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("[0, 12]"), std::string::npos) << s;
  EXPECT_EQ(Hist(id), h);
  EXPECT_FALSE(table().Get("", id)->busy);
  // Even one token back needs an image: the last history token is always the pending one.
  EXPECT_EQ(Rewind(id, 11).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(Rewind(id, 12).ok());
  EXPECT_EQ(Hist(id), h);
}

// With turn checkpoints, the earliest reachable position is the oldest one
// that the kept history can go on from.
TEST_F(RewindTest, CheckpointsReachPastTheKeptHistory) {
  SessionTableConfig tc;
  tc.history_tokens = 6;
  MakeWith(tc);
  const std::string id = New();
  Turn(id, {1, 2}, 1);           // 3 tokens: a checkpoint at 3
  Turn(id, {}, 1);               // 4: a checkpoint at 4
  Turn(id, {5, 6, 7, 8, 9}, 1);  // 10: history keeps 4..9, a checkpoint at 10
  const std::vector<int> h = Hist(id);
  absl::Status s = Rewind(id, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("earliest position it can go back to is 4 (and exactly to its checkpoints at 3)"),
            std::string::npos)
      << s;
  ASSERT_TRUE(Rewind(id, 3).ok()) << "a checkpoint exactly there";
  EXPECT_EQ(Hist(id), Prefix(h, 3));
  EXPECT_EQ(counter_.count("checkpoint"), 1);
}

// Bounded replay (docs/SESSIONS.md, "Bounded replay"): with no image near,
// a position whose last ReceptiveField tokens the kept history still holds
// is rebuilt from an empty state fed only them. The fake's state is the
// tokens it was fed and where they began.
TEST_F(RewindTest, KeptHistoryAsLongAsTheReceptiveFieldReachesBackWithoutAnImage) {
  SessionTableConfig tc;
  tc.history_tokens = 10;
  tc.checkpoints.budget_bytes = 0;
  MakeWith(tc);
  const int64_t field = engine_.ReceptiveField(4);  // 6
  const std::string id = New(/*mem_len=*/4);
  Turn(id, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, 4);  // 20 tokens; memory keeps 10..19
  const std::vector<int> h = Hist(id);
  ASSERT_EQ(h.size(), 20u);
  absl::Status s = Rewind(id, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("earliest position it can go back to is 17"), std::string::npos) << s;
  EXPECT_EQ(Hist(id), h);

  auto fork = ForkAt(id, 17);  // feeds h[10, 16), 16 pending
  ASSERT_TRUE(fork.ok()) << fork.status();
  ASSERT_TRUE(Rewind(id, 18).ok());  // feeds h[11, 17), 17 pending
  for (const auto& [session, position] : {std::pair{*fork, int64_t{17}}, std::pair{id, int64_t{18}}}) {
    auto lease = Take(session);
    const auto* state = static_cast<FakeSession*>(lease.state.get());
    EXPECT_EQ(state->start, position - 1 - field);
    EXPECT_EQ(state->history, std::vector<int>(h.begin() + (position - 1 - field), h.begin() + (position - 1)));
    EXPECT_EQ(lease.pending, std::vector<int>{h[position - 1]});
    EXPECT_EQ(lease.position(), position);
    table().Release(std::move(lease), absl::Now());
  }
  absl::MutexLock lock(&counter_.mu);
  EXPECT_EQ(counter_.replayed, 2 * field);
}

}  // namespace
}  // namespace txl
