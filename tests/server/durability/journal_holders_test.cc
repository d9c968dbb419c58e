// The session journal's claims between replicas sharing a directory state
// store: adoption once the holder is gone, the holder timeout, requests to
// hand a session over, ids another replica holds, a replica that lost its
// hold while it was paused, and a release that outlived its claim.
#include "server/durability/session_journal.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
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
using testing::FindsItLost;
using testing::FlakyBackend;
using testing::Meta;
using testing::Open;
using testing::ScopedDir;
using testing::Snapshot;
using testing::TakeOver;

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
  absl::StatusOr<JournalRecord> taken = TakeOver(b.get(), "s1", "alice");
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

// Regression: a session waiting for room for its version (held by this
// replica, out of its table) that another replica took over while this one
// was paused kept waiting here: its requests were refused (the version
// does not fit) instead of being asked of the replica that holds it.
TEST(SessionJournalTest, AWaitingSessionTakenOverByAnotherReplicaWaitsNoMore) {
  const ScopedDir scoped("waiting");
  FlakyBackend* flaky = nullptr;
  auto a = Open(scoped.path, "a", absl::Milliseconds(200), &flaky);
  auto b = Open(scoped.path, "b", absl::Milliseconds(200));
  a->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  ASSERT_TRUE(a->Flush().ok());
  a->Wait({"s1", "alice", "m@1", "fingerprint", "its version does not fit (test)"});
  const auto not_served = [](const std::string&) { return false; };
  EXPECT_TRUE(absl::IsFailedPrecondition(a->Waiting("s1", "alice", not_served)));
  flaky->Pause();
  absl::StatusOr<JournalRecord> taken = TakeOver(b.get(), "s1", "alice");
  ASSERT_TRUE(taken.ok()) << taken.status();
  flaky->Resume(/*apply_late=*/false);
  ASSERT_TRUE(FindsItLost(a.get(), "s1"));
  // Not offered for readmission, nor deleted when its ttl runs out here: b holds it.
  EXPECT_TRUE(a->Waiters().empty());
  absl::Status waiting = a->Waiting("s1", "alice", not_served);
  EXPECT_TRUE(waiting.ok()) << waiting;
  EXPECT_FALSE(a->IsWaiting("s1"));
  a->Wait({"s1", "alice", "m@1", "fingerprint", "put back after a failed adoption (test)"});
  EXPECT_FALSE(a->IsWaiting("s1")) << "a session another replica holds does not wait here";
}

// A session waiting for room for its version (out of the table, so no
// table expiry sees it) is deleted from the store once its idle ttl runs
// out, as an expired session is; one another replica took over is not.
TEST(SessionJournalTest, AWaitingSessionWhoseTtlRanOutIsDeletedFromTheStore) {
  const ScopedDir scoped("waiting_ttl");
  FlakyBackend* flaky = nullptr;
  auto a = Open(scoped.path, "a", absl::Milliseconds(200), &flaky);
  auto b = Open(scoped.path, "b", absl::Milliseconds(200));
  for (const char* id : {"s1", "s2"}) a->RecordCreate(Meta(id), Snapshot(0, {}, ""), nullptr);
  ASSERT_TRUE(a->Flush().ok());
  const absl::Time now = absl::Now();
  for (const char* id : {"s1", "s2"})
    a->Wait({id, "alice", "m@1", "fingerprint", "no room (test)", now + absl::Minutes(1)});
  EXPECT_EQ(a->ExpireWaiting(now), 0);
  EXPECT_EQ(a->waiting(), 2);
  // s2 is taken over by b while a is paused.
  flaky->Pause();
  ASSERT_TRUE(TakeOver(b.get(), "s2", "alice").ok());
  flaky->Resume(/*apply_late=*/false);
  ASSERT_TRUE(FindsItLost(a.get(), "s2"));
  EXPECT_EQ(a->ExpireWaiting(now + absl::Minutes(2)), 1);
  EXPECT_EQ(a->waiting(), 0);
  ASSERT_TRUE(a->Flush().ok());
  EXPECT_TRUE(absl::IsNotFound(a->Load("s1").status())) << a->Load("s1").status();
  auto held = a->Held();
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(held->empty());
  EXPECT_TRUE(b->Load("s2").ok()) << "the one b holds is still there";
}

// EndWait hands a waiting session back to its owner's caller only, once.
TEST(SessionJournalTest, EndWaitEndsOnlyTheOwnersWaitAndOnlyOnce) {
  const ScopedDir scoped("end_wait");
  auto a = Open(scoped.path, "a", absl::Milliseconds(200));
  a->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  ASSERT_TRUE(a->Flush().ok());
  a->Wait({"s1", "alice", "m@1", "fingerprint", "no room (test)"});
  EXPECT_FALSE(a->EndWait("s1", "bob").has_value());
  EXPECT_TRUE(a->IsWaiting("s1"));
  std::optional<SessionJournal::WaitingSession> ended = a->EndWait("s1", "alice");
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->model, "m@1");
  EXPECT_FALSE(a->IsWaiting("s1"));
  EXPECT_FALSE(a->EndWait("s1", "alice").has_value());
  // Put back under the claim it ended under: it waits again.
  a->Wait(*ended);
  EXPECT_TRUE(a->IsWaiting("s1"));
}

// Regression (review): a readmission whose adoption failed put its session
// back to wait even when its owner's request had adopted it meanwhile: the
// session was live and waiting at once, its requests were refused ("does not
// fit"), and its ttl would have deleted it from the store while in use. A
// claim now ends a wait, and a session claimed again since EndWait does
// not wait again.
TEST(SessionJournalTest, AClaimEndsAWaitAndASessionClaimedAgainDoesNotWaitAgain) {
  const ScopedDir scoped("wait_claim");
  auto a = Open(scoped.path, "a", absl::Milliseconds(200));
  a->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  ASSERT_TRUE(a->Flush().ok());
  // The owner's adoption after the readmitter's failed one: put back, then claimed.
  a->Wait({"s1", "alice", "m@1", "fingerprint", "no room (test)"});
  std::optional<SessionJournal::WaitingSession> ended = a->EndWait("s1", "alice");
  ASSERT_TRUE(ended.has_value());
  a->Wait(*ended);
  ASSERT_TRUE(a->IsWaiting("s1"));
  ASSERT_TRUE(a->Adopt("s1", "alice").ok());
  EXPECT_FALSE(a->IsWaiting("s1")) << "adopted: its wait is over";
  // The owner's adoption before the readmitter's failed one: not put back.
  a->Wait({"s1", "alice", "m@1", "fingerprint", "no room (test)"});
  ended = a->EndWait("s1", "alice");
  ASSERT_TRUE(ended.has_value());
  ASSERT_TRUE(a->Adopt("s1", "alice").ok());
  a->Wait(*ended);
  EXPECT_FALSE(a->IsWaiting("s1")) << "claimed again since EndWait: it is live, not waiting";
}

// Regression: a release queued under one claim (a session handed over) and
// written after the replica claimed the session again (a request adopted
// it back meanwhile) ended the new claim: the replica served a session it
// no longer held, and every write of it was refused.
TEST(SessionJournalTest, AReleaseQueuedBeforeTheSessionIsClaimedAgainLeavesTheNewClaim) {
  const ScopedDir scoped("release");
  FlakyBackend* flaky = nullptr;
  auto a = Open(scoped.path, "a", absl::Seconds(10), &flaky);
  a->RecordCreate(Meta("s0"), Snapshot(0, {}, ""), nullptr);
  a->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  ASSERT_TRUE(a->Flush().ok());
  flaky->HoldWrites();
  absl::Cleanup let_go = [flaky] { flaky->LetWritesGo(); };  // also when an assertion ends the test
  a->RecordTokens("s0", 0, {1});                             // the writer waits in this write...
  ASSERT_TRUE(flaky->AWriteIsHeld());
  a->RecordRelease("s1");  // ...and the release waits behind it
  auto again = a->Adopt("s1", "alice");
  ASSERT_TRUE(again.ok()) << again.status();
  flaky->LetWritesGo();
  ASSERT_TRUE(a->Flush().ok());
  EXPECT_TRUE(a->CheckHold("s1").ok());
  auto held = a->Held();
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, (std::vector<std::string>{"s0", "s1"}));
  a->RecordTokens("s1", 0, {7});
  EXPECT_TRUE(Durable(a.get(), "s1", 1).first.ok()) << "the new claim's writes are refused";
  // A release queued under the current claim still ends it.
  a->RecordRelease("s1");
  ASSERT_TRUE(a->Flush().ok());
  held = a->Held();
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, (std::vector<std::string>{"s0"}));
}

}  // namespace
}  // namespace txl
