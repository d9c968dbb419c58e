// The session journal's claims between replicas sharing a directory state
// store: adoption once the holder is gone, the holder timeout, requests to
// hand a session over, ids another replica holds, and a replica that lost
// its hold while it was paused.
#include "server/durability/session_journal.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/durability/state_backend.h"
#include "tests/server/durability/journal_fixture.h"

namespace txl {
namespace {

using testing::Answer;
using testing::Durable;
using testing::FlakyBackend;
using testing::Meta;
using testing::Open;
using testing::ScopedDir;
using testing::Snapshot;

TEST(SessionJournalTest, AdoptionWaitsForTheHolderToGoAndOnlyOneReplicaWins) {
  const ScopedDir scoped("adopt");  // removed after the journals below stop
  const std::string& dir = scoped.path;
  auto a = Open(dir, "a");
  auto b = Open(dir, "b");
  auto c = Open(dir, "c");
  a->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  a->RecordTokens("s1", 0, {4, 5});
  ASSERT_TRUE(a->Flush().ok());

  // Another principal learns nothing, not even that a replica holds it.
  EXPECT_TRUE(absl::IsNotFound(b->Adopt("s1", "mallory").status()));
  EXPECT_TRUE(absl::IsNotFound(b->Adopt("missing", "alice").status()));
  // Its holder is alive.
  auto live = b->Adopt("s1", "alice");
  EXPECT_TRUE(absl::IsUnavailable(live.status())) << live.status();
  EXPECT_NE(live.status().message().find("replica a"), std::string::npos);

  a.reset();  // a clean stop retires a's heartbeat
  auto won = b->Adopt("s1", "alice");
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_EQ(won->tail, (std::vector<int>{4, 5}));
  EXPECT_TRUE(absl::IsUnavailable(c->Adopt("s1", "alice").status())) << "b holds it now";
  EXPECT_EQ(*b->Held(), (std::vector<std::string>{"s1"}));
  EXPECT_TRUE(c->Held()->empty());
}

TEST(SessionJournalTest, AReplicaThatStoppedBeatingLosesItsSessionsAfterTheTimeout) {
  const ScopedDir scoped("stale");  // removed after the journals below stop
  const std::string& dir = scoped.path;
  auto a = Open(dir, "a", absl::Hours(1));  // beats every 15 min: not during this test
  auto b = Open(dir, "b", absl::Seconds(10));
  a->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  ASSERT_TRUE(a->Flush().ok());
  EXPECT_TRUE(absl::IsUnavailable(b->Adopt("s1", "alice").status()));
  // a's last heartbeat is now 11 s old, as if it died then (its next beat is seconds away).
  StateBackendConfig bc;
  bc.spec = "dir:" + dir;
  auto raw = OpenStateBackend(bc);
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE((*raw)->Put("replicas/a", absl::StrCat(absl::ToUnixNanos(absl::Now() - absl::Seconds(11)))).ok());
  auto won = b->Adopt("s1", "alice");
  ASSERT_TRUE(won.ok()) << won.status();
}

TEST(SessionJournalTest, TheHolderHearsThatAnotherReplicaWantsASession) {
  const ScopedDir scoped("wanted");  // removed after the journals below stop
  const std::string& dir = scoped.path;
  absl::Mutex mu;  // before the journals: a's handler may run until a stops
  std::vector<std::string> asked;
  auto a = Open(dir, "a", absl::Milliseconds(40));  // beats every 10 ms
  auto b = Open(dir, "b");
  a->SetHandoffHandler([&](std::vector<std::string> ids) {
    absl::MutexLock lock(&mu);
    asked.insert(asked.end(), ids.begin(), ids.end());
  });
  a->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  a->RecordCreate(Meta("s2"), Snapshot(0, {}, ""), nullptr);
  ASSERT_TRUE(a->Flush().ok());
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(asked.empty()) << "nobody asked yet";
  }
  // b's timeout is 10 s: a is alive. b asks for s1 and is told to retry.
  auto refused = b->Adopt("s1", "alice");
  ASSERT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("asked to hand it over"), std::string::npos);
  {
    absl::MutexLock lock(&mu);
    auto heard = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return !asked.empty(); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&heard), absl::Seconds(30)));
    EXPECT_EQ(asked.front(), "s1");
    for (const std::string& id : asked) EXPECT_EQ(id, "s1") << "only the session asked for";
  }
  a->RecordRelease("s1");
  ASSERT_TRUE(a->Flush().ok());
  auto won = b->Adopt("s1", "alice");
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_EQ(*a->Held(), (std::vector<std::string>{"s2"}));
  a->SetHandoffHandler(nullptr);
}

// Regression: creating a session whose id the store already has (another
// replica's session, or one this replica has not loaded) overwrote its state.
TEST(SessionJournalTest, CreatingAnIdTheStoreHasIsAlreadyExistsAndWritesNothing) {
  const ScopedDir scoped("create_taken");
  const std::string& dir = scoped.path;
  auto a = Open(dir, "a");
  auto b = Open(dir, "b");
  absl::Notification first;
  a->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    first.Notify();
  });
  ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(30)));
  a->RecordTokens("s1", 0, {4, 5});
  ASSERT_TRUE(a->Flush().ok());

  absl::Notification second;
  absl::Status taken;
  b->RecordCreate(Meta("s1", "mallory"), Snapshot(0, {}, ""), [&](absl::Status s) {
    taken = s;
    second.Notify();
  });
  ASSERT_TRUE(second.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(absl::IsAlreadyExists(taken)) << taken;
  auto r = a->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->meta.owner, "alice");
  EXPECT_EQ(r->tail, (std::vector<int>{4, 5}));
  EXPECT_EQ(*a->Held(), (std::vector<std::string>{"s1"}));
  EXPECT_TRUE(b->Flush().ok()) << "ALREADY_EXISTS is an answer, not a store failure";
}

// Regression (issue 29): a replica that paused past its holder timeout
// served and wrote a session another replica had taken over meanwhile.
TEST(SessionJournalTest, AReplicaThatLostItsHoldCanNeitherWriteNorServeTheSession) {
  const ScopedDir scoped("fenced");
  absl::Mutex mu;  // before the journals: a's handler may run until a stops
  std::vector<std::string> let_go;
  FlakyBackend* flaky = nullptr;
  auto a = Open(scoped.path, "a", absl::Milliseconds(200), &flaky);
  auto b = Open(scoped.path, "b", absl::Milliseconds(200));
  a->SetHandoffHandler([&](std::vector<std::string> ids) {
    absl::MutexLock lock(&mu);
    let_go.insert(let_go.end(), ids.begin(), ids.end());
  });
  a->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  a->RecordTokens("s1", 0, {1, 2});
  ASSERT_TRUE(Durable(a.get(), "s1", 2).first.ok());
  EXPECT_TRUE(a->CheckHold("s1").ok());
  // a stops answering (its heartbeats fail, as when it is paused); b takes over once a's beat is old.
  flaky->Pause();
  absl::StatusOr<JournalRecord> taken;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  do {
    taken = b->Adopt("s1", "alice");
  } while (absl::IsUnavailable(taken.status()) && absl::Now() < deadline);
  ASSERT_TRUE(taken.ok()) << taken.status();
  b->RecordTokens("s1", 2, {30});
  ASSERT_TRUE(Durable(b.get(), "s1", 3).first.ok());
  flaky->Resume(/*apply_late=*/true);
  // a comes back: its heartbeats had a gap, so it may not serve its copy
  // (UNAVAILABLE) until it has read the holder again, and then finds it lost.
  absl::Status held = a->CheckHold("s1");
  EXPECT_TRUE(absl::IsUnavailable(held)) << held;
  const absl::Time checked = absl::Now() + absl::Seconds(30);
  while (!a->Lost("s1") && absl::Now() < checked) {
    held = a->CheckHold("s1");
    EXPECT_TRUE(absl::IsUnavailable(held)) << "served its stale copy: " << held;
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(a->Lost("s1"));
  EXPECT_NE(a->CheckHold("s1").message().find("another replica"), std::string::npos);
  {
    absl::MutexLock lock(&mu);  // the scheduler is told to let its copy go
    auto told = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return !let_go.empty(); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&told), absl::Seconds(30)));
    EXPECT_EQ(let_go, (std::vector<std::string>{"s1"}));
  }
  // Its writes are fenced off in the store too.
  a->RecordTokens("s1", 2, {20});
  auto [refused, have] = Durable(a.get(), "s1", 3);
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_NE(refused.message().find("another replica"), std::string::npos) << refused;
  Answer deleted;
  a->RecordDelete("s1", deleted.Done());
  ASSERT_TRUE(deleted.Wait());
  EXPECT_FALSE(deleted.status.ok()) << "a expiring its copy must not delete b's session";
  auto r = b->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tail, (std::vector<int>{1, 2, 30})) << "one history: b's";
  a->SetHandoffHandler(nullptr);
}

}  // namespace
}  // namespace txl
