// The session journal on a directory state store: its records and their
// replay (snapshots, the log, rewinds, forks), the order of its writes, and
// damage to what it wrote (a torn tail is cut off, anything else quarantined).
#include "server/durability/session_journal.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/durability/recovery.h"
#include "server/durability/state_backend.h"
#include "tests/server/durability/journal_fixture.h"

namespace txl {
namespace {

namespace fs = std::filesystem;
using testing::Corrupt;
using testing::Durable;
using testing::Meta;
using testing::Open;
using testing::ScopedDir;
using testing::Snapshot;

TEST(SessionMetaTest, RoundTripsAndRejectsDamage) {
  SessionMeta m = Meta("abc");
  auto back = DecodeSessionMeta(EncodeSessionMeta(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, "abc");
  EXPECT_EQ(back->owner, "alice");
  EXPECT_EQ(back->mem_len, 16);
  EXPECT_EQ(back->idle_ttl, absl::Seconds(60));
  EXPECT_EQ(back->created, m.created);
  EXPECT_EQ(back->labels, m.labels);
  std::string bytes = EncodeSessionMeta(m);
  bytes[12] ^= 1;
  EXPECT_TRUE(absl::IsDataLoss(DecodeSessionMeta(bytes).status()));
  EXPECT_TRUE(absl::IsDataLoss(DecodeSessionMeta(bytes.substr(0, 10)).status()));
}

TEST(SessionMetaTest, CarriesItsModelVersionAndReadsMetasWithoutOne) {
  SessionMeta m = Meta("abc");
  const std::string without = EncodeSessionMeta(m);  // the form written before versions
  m.model = "char@7";
  const std::string with = EncodeSessionMeta(m);
  // A label as servers before versions read it: key and value strings.
  EXPECT_EQ(with.size(), without.size() + 2 * sizeof(uint32_t) + strlen(kModelLabel) + m.model.size());
  auto back = DecodeSessionMeta(with);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model, "char@7");
  EXPECT_EQ(back->labels, m.labels);
  auto old = DecodeSessionMeta(without);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->model, "");
  std::string damaged = with;
  damaged[damaged.size() - 9] ^= 1;  // the model's last byte
  EXPECT_TRUE(absl::IsDataLoss(DecodeSessionMeta(damaged).status()));
}

// The fuzz seeds of the journal's formats (tests/fuzz/make_corpus.py writes
// them in Python) are valid, so the fuzzer starts from the accepting paths.
TEST(SessionJournalTest, FuzzSeedsAreWellFormed) {
  const fs::path seeds = fs::path(TXL_SOURCE_DIR) / "tests" / "fuzz" / "corpus" / "session_import";
  auto read = [&](const char* name) {
    std::ifstream f(seeds / name, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_FALSE(s.empty()) << name;
    return s.empty() ? s : s.substr(1);  // byte 0 picks the fuzzer's mode
  };
  auto meta = DecodeSessionMeta(read("journal_meta"));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->owner, "alice");
  for (const char* name : {"journal_log", "journal_log_torn"}) {
    JournalRecord r;
    r.image.position = 2;
    ASSERT_TRUE(ReplayJournalLog(read(name), &r).ok()) << name;
    EXPECT_EQ(r.tail, (std::vector<int>{1, 2, 3, 4, 5, 6})) << name;
  }
  // Positions no journal writes, under checksums that pass: refused, not replayed.
  for (const char* name : {"journal_log_negative_start", "journal_log_overflow"}) {
    JournalRecord r;
    r.image.position = 0;
    const absl::Status s = ReplayJournalLog(read(name), &r);
    EXPECT_TRUE(absl::IsDataLoss(s)) << name << ": " << s;
    EXPECT_TRUE(absl::IsDataLoss(TruncateJournalLog(read(name), 1).status())) << name;
  }
}

TEST(SessionJournalTest, LogAfterSnapshotReplaysToTheHistory) {
  const ScopedDir scoped("replay");  // removed after the journals below stop
  const std::string& dir = scoped.path;
  auto j = Open(dir, "r1");
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  j->RecordTokens("s1", 0, {1, 2, 3});
  j->RecordTokens("s1", 3, {4});
  ASSERT_TRUE(j->Flush().ok());
  auto r = j->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->position(), 4);
  EXPECT_EQ(r->tail, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(r->meta.owner, "alice");

  // A snapshot at 4 (the log goes on); a record that overlaps it replays only what is new.
  j->RecordSnapshot("s1", Snapshot(4, {4}, "16 1 2 3"));
  j->RecordTokens("s1", 3, {4, 5, 6});
  ASSERT_TRUE(j->Flush().ok());
  r = j->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->image.position, 4);
  EXPECT_EQ(r->tail, (std::vector<int>{5, 6}));
  EXPECT_EQ(r->earlier, (std::vector<int>{1, 2, 3, 4})) << "the log keeps the history before the snapshot";
  EXPECT_EQ(r->history_start(), 0);
  EXPECT_EQ(r->position(), 6);

  std::vector<int> pending;
  auto idle = IdleFromRecord(*r, &pending);
  EXPECT_EQ(idle->state, "16 1 2 3");
  EXPECT_EQ(idle->feed, (std::vector<int>{4, 5}));
  EXPECT_EQ(pending, (std::vector<int>{6}));

  auto held = j->Held();
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(*held, (std::vector<std::string>{"s1"}));
  EXPECT_TRUE(absl::IsNotFound(j->Load("nope").status()));
}

TEST(SessionJournalTest, TornTailIsIgnoredButDamageIsQuarantined) {
  const ScopedDir scoped("damage");  // removed after the journals below stop
  const std::string& dir = scoped.path;
  auto j = Open(dir, "r1");
  for (const char* id : {"torn", "bad", "gap"}) {
    j->RecordCreate(Meta(id), Snapshot(0, {}, ""), nullptr);
    j->RecordTokens(id, 0, {7, 8});
  }
  j->RecordTokens("bad", 2, {9});
  ASSERT_TRUE(j->Flush().ok());
  {
    // A journal never writes a gap (JournalRefusesWritesThatWouldLeaveAGap),
    // nor a session it does not hold, so the store is damaged behind its
    // back: a record that starts past the end of the history (a fork's log
    // elsewhere starts with one at 5) appended by hand.
    const ScopedDir elsewhere("damage_src");
    auto other = Open(elsewhere.path, "r2");
    other->RecordCreate(Meta("src"), Snapshot(6, {9}, ""), nullptr, 5, {9});
    ASSERT_TRUE(other->Flush().ok());
    std::ifstream in(fs::path(elsewhere.path) / "sessions" / "src" / "log", std::ios::binary);
    const std::string record((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(record.empty());
    std::ofstream out(fs::path(dir) / "sessions" / "gap" / "log", std::ios::app | std::ios::binary);
    out.write(record.data(), static_cast<std::streamsize>(record.size()));
  }
  const fs::path sessions = fs::path(dir) / "sessions";
  {
    std::ofstream f(sessions / "torn" / "log", std::ios::app | std::ios::binary);
    f.write("\x05\x00\x00", 3);  // a record cut short by a crash
  }
  Corrupt(sessions / "bad" / "log", 14);  // inside the first record

  auto torn = j->Load("torn");
  ASSERT_TRUE(torn.ok()) << torn.status();
  EXPECT_EQ(torn->tail, (std::vector<int>{7, 8}));

  for (const char* id : {"bad", "gap"}) {
    auto r = j->Load(id);
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << id << ": " << r.status();
    EXPECT_NE(r.status().message().find("quarantined"), std::string::npos);
    EXPECT_FALSE(fs::exists(sessions / id / "log")) << id;
    EXPECT_TRUE(absl::IsNotFound(j->Load(id).status())) << id << " is gone after quarantine";
  }
  EXPECT_EQ(j->quarantined(), 2);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "quarantine" / "sessions" / "bad"));

  // A damaged snapshot is damage too.
  j->RecordCreate(Meta("snap"), Snapshot(2, {8}, "16 7"), nullptr);
  ASSERT_TRUE(j->Flush().ok());
  Corrupt(sessions / "snap" / "snap", 20);
  EXPECT_TRUE(absl::IsDataLoss(j->Load("snap").status()));
}

// Regression: the torn record stayed in the log, so the records appended
// after it were unreadable at the next recovery and the session was lost.
TEST(SessionJournalTest, ATornTailIsCutOffSoLaterRecordsReplay) {
  const ScopedDir scoped("torn_then_more");  // removed after the journals below stop
  const std::string& dir = scoped.path;
  auto j = Open(dir, "r1");
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  j->RecordTokens("s1", 0, {7, 8});
  ASSERT_TRUE(j->Flush().ok());
  const fs::path log = fs::path(dir) / "sessions" / "s1" / "log";
  const auto whole = fs::file_size(log);
  {
    std::ofstream f(log, std::ios::app | std::ios::binary);
    f.write("\x05\x00\x00\x00\x02\x00\x00", 7);  // a crash in the middle of the next append
  }
  auto first = j->Load("s1");  // the recovery after that crash
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(fs::file_size(log), whole) << "the torn record is cut off";
  j->RecordTokens("s1", 2, {9});  // what the recovered session does next
  ASSERT_TRUE(j->Flush().ok());
  auto second = j->Load("s1");  // the next crash's recovery
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->tail, (std::vector<int>{7, 8, 9}));
}

// Regression: a damaged length field in a middle record looked like a torn
// tail, and the history was silently cut there.
TEST(SessionJournalTest, ADamagedLengthIsDamageNotATornTail) {
  const ScopedDir scoped("bad_length");  // removed after the journals below stop
  const std::string& dir = scoped.path;
  auto j = Open(dir, "r1");
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  j->RecordTokens("s1", 0, {1, 2});
  j->RecordTokens("s1", 2, {3});
  j->RecordTokens("s1", 3, {4});
  ASSERT_TRUE(j->Flush().ok());
  const fs::path log = fs::path(dir) / "sessions" / "s1" / "log";
  Corrupt(log, 36 + 1);  // the second record's length: it now runs past the end of the log
  auto r = j->Load("s1");
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("header"), std::string::npos) << r.status();
}

// Regression (issue 13, 2): after a failed write, later records of the
// same session were still appended, leaving a log that starts past the end
// of its history ("log record at byte 40 starts at position 10 but the
// history ends at 3"): the session was quarantined after a crash.
TEST(SessionJournalTest, JournalRefusesWritesThatWouldLeaveAGap) {
  const ScopedDir scoped("gapless");
  auto j = Open(scoped.path, "r1");
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  j->RecordTokens("s1", 0, {1, 2});
  j->RecordTokens("s1", 5, {9});                      // a gap: not written
  j->RecordSnapshot("s1", Snapshot(7, {7}, "16 1"));  // holds history the store never had: not written
  auto [status, have] = Durable(j.get(), "s1", 6);
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_EQ(have, 2);
  EXPECT_TRUE(j->Writable().ok()) << "a refused record is not a store failure";
  auto r = j->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->position(), 2);
  EXPECT_EQ(r->image.position, 0);
  j->RecordTokens("s1", 2, {3});  // continuing exactly is fine
  EXPECT_TRUE(Durable(j.get(), "s1", 3).first.ok());
}

TEST(SessionJournalTest, AfterRunsOnlyOnceEverythingBeforeIsWritten) {
  const ScopedDir scoped("after");  // removed after the journals below stop
  const std::string& dir = scoped.path;
  auto j = Open(dir, "r1");
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  int64_t seen = -1;
  absl::Notification done;
  for (int i = 0; i < 50; ++i) j->RecordTokens("s1", i, {i});
  j->After([&](absl::Status s) {
    EXPECT_TRUE(s.ok());
    auto r = j->Load("s1");  // on the writer thread, after the writes
    seen = r.ok() ? r->position() : -2;
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(seen, 50);
}

TEST(SessionJournalTest, ARewindCutsTheLogAndWritesASnapshotOnlyWhenTheStoredOneIsLater) {
  const ScopedDir scoped("rewind");
  auto j = Open(scoped.path, "r1");
  j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
  j->RecordTokens("s1", 0, {1, 2, 3, 4, 5, 6});
  j->RecordSnapshot("s1", Snapshot(6, {6}, "16 1 2 3 4 5"));
  j->RecordTokens("s1", 6, {7, 8});
  absl::Notification done;
  absl::Status written;
  j->RecordRewind("s1", 7, Snapshot(7, {7}, "16 1 2 3 4 5 6"), [&](absl::Status s) {
    written = s;
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(written.ok()) << written;
  auto r = j->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->image.position, 6) << "the stored snapshot (6) is not later than 7: kept";
  EXPECT_EQ(r->tail, (std::vector<int>{7}));
  EXPECT_EQ(r->position(), 7);
  EXPECT_EQ(Durable(j.get(), "s1", 7).first, absl::OkStatus());

  // Back past the snapshot: a new one at 3 goes first, then the log is cut.
  absl::Notification done2;
  j->RecordRewind("s1", 3, Snapshot(3, {3}, "16 1 2"), [&](absl::Status s) {
    written = s;
    done2.Notify();
  });
  ASSERT_TRUE(done2.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(written.ok()) << written;
  r = j->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->image.position, 3);
  EXPECT_TRUE(r->tail.empty());
  EXPECT_EQ(r->earlier, (std::vector<int>{1, 2, 3}));
  j->RecordTokens("s1", 3, {9});  // the history goes on from 3
  ASSERT_TRUE(j->Flush().ok());
  r = j->Load("s1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tail, (std::vector<int>{9}));

  // Past the durable position: refused, nothing written.
  absl::Notification done3;
  j->RecordRewind("s1", 9, Snapshot(9, {}, "16"), [&](absl::Status s) {
    written = s;
    done3.Notify();
  });
  ASSERT_TRUE(done3.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(absl::IsUnavailable(written)) << written;
  EXPECT_EQ(j->Load("s1")->position(), 4);
}

// The rewind writes its snapshot, then the log. A crash between the two
// leaves the new (earlier) snapshot with the old log, which replays to the
// history before the rewind: the client was not told of it, and it did not happen.
TEST(SessionJournalTest, ACrashBetweenARewindsSnapshotAndItsLogKeepsTheOldHistory) {
  const ScopedDir scoped("rewind_crash");
  {
    auto j = Open(scoped.path, "r1");
    j->RecordCreate(Meta("s1"), Snapshot(0, {}, ""), nullptr);
    j->RecordTokens("s1", 0, {1, 2, 3, 4, 5});
    j->RecordSnapshot("s1", Snapshot(5, {5}, "16 1 2 3 4"));
    ASSERT_TRUE(j->Flush().ok());
  }
  StateBackendConfig bc;
  bc.spec = scoped.path;
  auto backend = OpenStateBackend(bc);
  ASSERT_TRUE(backend.ok());
  ASSERT_TRUE((*backend)->Put("sessions/s1/snap", Snapshot(2, {2}, "16 1")).ok());  // and then the crash
  auto j = Open(scoped.path, "r1");
  auto r = j->Load("s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->position(), 5);
  EXPECT_EQ(r->tail, (std::vector<int>{3, 4, 5}));
}

TEST(SessionJournalTest, AForksLogStartsWithTheHistoryItInherits) {
  const ScopedDir scoped("fork_history");
  auto j = Open(scoped.path, "r1");
  j->RecordCreate(Meta("f1"), Snapshot(4, {40}, "16 10 20 30"), nullptr, 0, {10, 20, 30, 40});
  j->RecordTokens("f1", 4, {50});
  ASSERT_TRUE(j->Flush().ok());
  auto r = j->Load("f1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->image.position, 4);
  EXPECT_EQ(r->earlier, (std::vector<int>{10, 20, 30, 40}));
  EXPECT_EQ(r->tail, (std::vector<int>{50}));
  auto cut = TruncateJournalLog("", 3);
  ASSERT_TRUE(cut.ok());
  EXPECT_TRUE(cut->empty());
}

}  // namespace
}  // namespace txl
