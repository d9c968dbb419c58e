// The session journal on a state store that fails, hangs or loses replies:
// nothing is acknowledged that was not written, the store is found writable
// again, and a write whose outcome is unknown is answered by what landed.
#include "server/durability/session_journal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/durability/state_backend_impl.h"
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

TEST(SessionJournalTest, AFailedWriteIsNeverAcknowledgedAndTheStoreRecovers) {
  const ScopedDir scoped("flaky");
  FlakyBackend* flaky = nullptr;
  auto j = Open(scoped.path, "r1", absl::Seconds(10), &flaky);
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  j->RecordTokens("s1", 0, {1, 2});
  ASSERT_TRUE(Durable(j.get(), "s1", 2).first.ok());
  flaky->failing = true;
  j->RecordTokens("s1", 2, {3, 4});
  auto [failed, have] = Durable(j.get(), "s1", 4);
  EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
  EXPECT_NE(failed.message().find("No space left"), std::string::npos) << failed;
  EXPECT_EQ(have, 2);
  EXPECT_TRUE(absl::IsUnavailable(j->Writable()));
  // A create refused by the store leaves its id free.
  absl::Notification created;
  absl::Status create_status;
  j->RecordCreate(Meta("s2"), Snapshot(0, {}, ""), [&](absl::Status s) {
    create_status = s;
    created.Notify();
  });
  ASSERT_TRUE(created.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(absl::IsUnavailable(create_status) || absl::IsResourceExhausted(create_status)) << create_status;
  // A delete refused by the store leaves the session.
  absl::Notification deleted;
  absl::Status delete_status;
  j->RecordDelete("s1", [&](absl::Status s) {
    delete_status = s;
    deleted.Notify();
  });
  ASSERT_TRUE(deleted.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(delete_status.ok());

  flaky->failing = false;
  j->RecordTokens("s1", 4, {5});  // past what the store has: refused even now
  EXPECT_EQ(Durable(j.get(), "s1", 5).second, 2);
  j->RecordTokens("s1", 2, {7, 8});  // the session, rolled back, goes on from 2
  EXPECT_TRUE(Durable(j.get(), "s1", 4).first.ok());
  EXPECT_TRUE(j->Writable().ok()) << "not sticky: a write succeeded";
  auto r = j->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tail, (std::vector<int>{1, 2, 7, 8}));
  EXPECT_TRUE(absl::IsNotFound(j->Load("s2").status())) << "the refused create left nothing behind";
  absl::Notification again;
  j->RecordCreate(Meta("s2"), Snapshot(0, {}, ""), [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << "the id is free: " << s;
    again.Notify();
  });
  ASSERT_TRUE(again.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

TEST(SessionJournalTest, TheHeartbeatTellsWhenTheStoreIsWritableAgain) {
  const ScopedDir scoped("beat");
  FlakyBackend* flaky = nullptr;
  auto j = Open(scoped.path, "r1", absl::Milliseconds(40), &flaky);
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  ASSERT_TRUE(j->Flush().ok());
  flaky->failing = true;
  j->RecordTokens("s1", 0, {1});
  (void)j->Flush();
  ASSERT_FALSE(j->Writable().ok());
  flaky->failing = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!j->Writable().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(j->Writable().ok()) << "no write was queued: the heartbeat found the store writable";
}

// Regression (issue 29): a write the store applied after its reply was lost
// (or after the server gave up on it) extended a history the client was
// told was refused. Now its answer waits until the journal has read back
// what landed, and follows it.
TEST(SessionJournalTest, AnAnswerWhoseWriteHasAnUnknownOutcomeFollowsWhatLanded) {
  const ScopedDir scoped("unknown");
  FlakyBackend* flaky = nullptr;
  auto j = Open(scoped.path, "r1", absl::Milliseconds(40), &flaky);
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  j->RecordTokens("s1", 0, {1, 2});
  ASSERT_TRUE(Durable(j.get(), "s1", 2).first.ok());

  // The reply is lost, the write landed: acknowledged once read back.
  flaky->lose_replies = 1;
  j->RecordTokens("s1", 2, {3});
  auto [landed, at] = Durable(j.get(), "s1", 3);
  EXPECT_TRUE(landed.ok()) << landed;
  EXPECT_EQ(at, 3);

  // The store hangs: the answer waits (it is not a refusal yet)...
  flaky->Pause();
  j->RecordTokens("s1", 3, {4, 5});
  std::pair<absl::Status, int64_t> late{absl::InternalError("not answered"), -1};
  absl::Notification answered;
  j->AfterDurable("s1", 5, [&](absl::Status s, int64_t have) {
    late = {s, have};
    answered.Notify();
  });
  (void)j->Flush();  // the writer thread has handled both
  EXPECT_FALSE(answered.HasBeenNotified()) << late.first;
  EXPECT_GE(flaky->late_writes(), 1);
  // ...and what it had buffered lands when it comes back: acknowledged.
  flaky->Resume(/*apply_late=*/true);
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(late.first.ok()) << late.first;
  EXPECT_EQ(late.second, 5);

  // The store hangs and drops what it had: once the session is fenced
  // again, the write that did not land is sent again (nobody was told
  // anything yet), and then acknowledged.
  flaky->Pause();
  j->RecordTokens("s1", 5, {6});
  absl::Notification retried;
  std::pair<absl::Status, int64_t> again;
  j->AfterDurable("s1", 6, [&](absl::Status s, int64_t have) {
    again = {s, have};
    retried.Notify();
  });
  (void)j->Flush();
  EXPECT_FALSE(retried.HasBeenNotified());
  flaky->Resume(/*apply_late=*/false);
  ASSERT_TRUE(retried.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(again.first.ok()) << again.first;
  EXPECT_EQ(again.second, 6);
  j->RecordTokens("s1", 6, {7});
  ASSERT_TRUE(Durable(j.get(), "s1", 7).first.ok());
  auto r = j->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tail, (std::vector<int>{1, 2, 3, 4, 5, 6, 7}));
}

TEST(SessionJournalTest, CreatesRewindsAndDeletesWithUnknownOutcomesAreAnsweredByWhatLanded) {
  const ScopedDir scoped("unknown_ops");
  FlakyBackend* flaky = nullptr;
  auto j = Open(scoped.path, "r1", absl::Milliseconds(40), &flaky);
  // A create whose reply is lost: it exists, and says so.
  flaky->lose_replies = 1;
  Answer created;
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), created.Done());
  ASSERT_TRUE(created.Wait());
  EXPECT_TRUE(created.status.ok()) << created.status;
  j->RecordTokens("s1", 0, {1, 2, 3});
  ASSERT_TRUE(Durable(j.get(), "s1", 3).first.ok()) << "it is held: its writes go on";
  // A create the store never applied: refused, and the id is free.
  flaky->Pause();
  Answer never;
  j->RecordCreate(Meta("s2"), Snapshot(0, {}, ""), never.Done());
  (void)j->Flush();
  EXPECT_FALSE(never.called.HasBeenNotified());
  flaky->Resume(/*apply_late=*/false);
  ASSERT_TRUE(never.Wait());
  EXPECT_TRUE(absl::IsUnavailable(never.status)) << never.status;
  EXPECT_TRUE(absl::IsNotFound(j->Load("s2").status()));
  Answer again;
  j->RecordCreate(Meta("s2"), Snapshot(0, {}, ""), again.Done());
  ASSERT_TRUE(again.Wait());
  EXPECT_TRUE(again.status.ok()) << again.status;
  // A rewind whose reply is lost: done. (A rewind reads the log first: a
  // store that does not answer refuses it before anything is sent.)
  flaky->lose_replies = 1;
  Answer rewound;
  j->RecordRewind("s1", 1, Snapshot(1, {1}, "16"), rewound.Done());
  ASSERT_TRUE(rewound.Wait());
  EXPECT_TRUE(rewound.status.ok()) << rewound.status;
  EXPECT_EQ(j->Load("s1")->position(), 1);
  // A delete that never lands: refused, the session is there.
  flaky->Pause();
  Answer kept;
  j->RecordDelete("s1", kept.Done());
  (void)j->Flush();
  flaky->Resume(/*apply_late=*/false);
  ASSERT_TRUE(kept.Wait());
  EXPECT_TRUE(absl::IsUnavailable(kept.status)) << kept.status;
  EXPECT_EQ(j->Load("s1")->position(), 1);
  // One whose reply is lost: deleted.
  flaky->lose_replies = 1;
  Answer deleted;
  j->RecordDelete("s1", deleted.Done());
  ASSERT_TRUE(deleted.Wait());
  EXPECT_TRUE(deleted.status.ok()) << deleted.status;
  EXPECT_TRUE(absl::IsNotFound(j->Load("s1").status()));
}

// The same rule when the directory store fails midway (fault injection): a
// rename that happened though its call failed, an append whose roll-back failed.
TEST(SessionJournalTest, DirectoryWritesThatFailAfterTakingEffectAreReadBack) {
  const ScopedDir scoped("faults");
  auto j = Open(scoped.path, "r1", absl::Milliseconds(40));
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  j->RecordTokens("s1", 0, {1, 2, 3});
  ASSERT_TRUE(Durable(j.get(), "s1", 3).first.ok());
  std::atomic<int> faults{0};
  // Each point fails once, for s1's keys.
  auto inject = [&](std::set<std::string> points) {
    auto left = std::make_shared<std::set<std::string>>(std::move(points));
    state_backend_internal::SetDirectoryFaultsForTest([&faults, left](absl::string_view point, const std::string& key) {
      if (!left->count(std::string(point)) || key.find("/s1/") == std::string::npos) return 0;
      left->erase(std::string(point));
      ++faults;
      return EIO;
    });
  };
  // An append that fails and is rolled back: refused, nothing of it stays.
  inject({"append"});
  j->RecordTokens("s1", 3, {4});
  auto [refused, have] = Durable(j.get(), "s1", 4);
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_EQ(have, 3);
  // One whose roll-back fails too: it is in the log, so it is acknowledged.
  inject({"append", "truncate"});
  j->RecordTokens("s1", 3, {5});
  auto [kept, at] = Durable(j.get(), "s1", 4);
  state_backend_internal::SetDirectoryFaultsForTest(nullptr);
  EXPECT_TRUE(kept.ok()) << kept;
  EXPECT_EQ(at, 4);
  // A rewind whose log rename happened but whose call failed: done.
  inject({"rename"});
  Answer rewound;
  j->RecordRewind("s1", 2, Snapshot(2, {2}, "16 1"), rewound.Done());
  ASSERT_TRUE(rewound.Wait());
  state_backend_internal::SetDirectoryFaultsForTest(nullptr);
  EXPECT_TRUE(rewound.status.ok()) << rewound.status;
  EXPECT_GE(faults.load(), 3);
  j->RecordTokens("s1", 2, {9});
  ASSERT_TRUE(Durable(j.get(), "s1", 3).first.ok());
  auto r = j->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->image.position, 0) << "the stored snapshot (at 0) was not later than the rewind";
  EXPECT_EQ(r->tail, (std::vector<int>{1, 2, 9}));
}

}  // namespace
}  // namespace txl
