// The session journal on a directory state store: records, replay, damage
// and quarantine, claims between replicas; and the scheduler with a journal
// and with offload, against the fake engine (its state is its history, so
// "rebuilt exactly" is checkable).
#include "server/durability/session_journal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/batching/scheduler.h"
#include "server/durability/recovery.h"
#include "server/durability/state_backend_impl.h"
#include "tests/server/fake_engine.h"
#include "tests/server/job_outcome.h"

namespace txl {
namespace {

namespace fs = std::filesystem;
using testing::FakeEngine;
using testing::FakeSession;

std::string TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / absl::StrCat("txl_journal_", name, "_", getpid());
  fs::remove_all(p);
  return p.string();
}

// A temporary directory, removed when it goes out of scope: declared before
// the journals that write into it, it outlives their writer threads.
struct ScopedDir {
  explicit ScopedDir(const std::string& name) : path(TempDir(name)) {}
  ~ScopedDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

// A directory store that misbehaves on demand:
//  - `failing`: every write fails and writes nothing, as a full or read-only
//    disk does (reads still work);
//  - `lose_replies`: that many guarded writes are applied but answer
//    UNKNOWN, as when the reply is lost;
//  - Pause(): nothing answers (UNAVAILABLE), and guarded writes sent meanwhile
//    answer UNKNOWN and are kept, to be applied late by Resume(true) (the
//    store applies what it had buffered) or dropped by Resume(false);
//    Pause(/*writes_only=*/true): only the guarded writes hang (a
//    connection that does: the heartbeats still get through).
class FlakyBackend : public StateBackend {
 public:
  explicit FlakyBackend(std::unique_ptr<StateBackend> inner) : inner_(std::move(inner)) {}
  std::atomic<bool> failing{false};
  std::atomic<int> lose_replies{0};
  void Pause(bool writes_only = false) {
    absl::MutexLock lock(&mu_);
    paused_ = true;
    writes_only_ = writes_only;
  }
  void Resume(bool apply_late) {
    absl::MutexLock lock(&mu_);
    for (const auto& writes : late_) {
      std::vector<int> outcomes;
      if (apply_late) EXPECT_TRUE(inner_->Write(writes, &outcomes).ok());
    }
    late_.clear();
    paused_ = false;
  }
  int late_writes() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(late_.size());
  }
  std::string Describe() const override { return inner_->Describe(); }
  absl::Status Put(const std::string& key, absl::string_view value) override {
    RETURN_IF_ERROR(Answering());
    return failing ? Full() : inner_->Put(key, value);
  }
  bool AppliesLate() const override { return true; }  // Pause() keeps writes to apply late
  absl::Status Write(const std::vector<StoreWrite>& writes, std::vector<int>* outcomes) override {
    {
      absl::MutexLock lock(&mu_);
      if (paused_) {
        late_.push_back(writes);
        outcomes->assign(writes.size(), kWriteUnknown);
        return absl::UnknownError("timed out (test): the store is paused");
      }
    }
    if (failing) {
      outcomes->assign(writes.size(), kWriteNotApplied);
      return Full();
    }
    absl::Status s = inner_->Write(writes, outcomes);
    if (s.ok() && lose_replies.fetch_sub(1) > 0) {
      outcomes->assign(writes.size(), kWriteUnknown);
      return absl::UnknownError("the reply was lost (test)");
    }
    return s;
  }
  absl::StatusOr<std::string> Get(const std::string& key) override {
    RETURN_IF_ERROR(Answering());
    return inner_->Get(key);
  }
  absl::Status Delete(const std::string& key) override {
    RETURN_IF_ERROR(Answering());
    return failing ? Full() : inner_->Delete(key);
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& prefix) override {
    RETURN_IF_ERROR(Answering());
    return inner_->List(prefix);
  }
  absl::StatusOr<bool> CompareAndSet(const std::string& key, const std::optional<std::string>& expected,
                                     absl::string_view value) override {
    RETURN_IF_ERROR(Answering());
    if (failing) return Full();
    return inner_->CompareAndSet(key, expected, value);
  }
  absl::Status Quarantine(const std::string& key) override { return inner_->Quarantine(key); }

 private:
  static absl::Status Full() { return absl::ResourceExhaustedError("No space left on device (test)"); }
  absl::Status Answering() {
    absl::MutexLock lock(&mu_);
    return paused_ && !writes_only_ ? absl::UnavailableError("timed out (test): the store is paused")
                                    : absl::OkStatus();
  }
  std::unique_ptr<StateBackend> inner_;
  absl::Mutex mu_;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_only_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::vector<StoreWrite>> late_ ABSL_GUARDED_BY(mu_);
};

// A journal on the directory store `dir`; with `flaky`, the store is wrapped
// in a FlakyBackend, and *flaky stays valid while the journal lives.
std::unique_ptr<SessionJournal> Open(const std::string& dir, const std::string& replica,
                                     absl::Duration holder_timeout = absl::Seconds(10),
                                     FlakyBackend** flaky = nullptr) {
  StateBackendConfig b;
  b.spec = "dir:" + dir;
  b.fsync = FsyncPolicy::kNever;
  auto backend = OpenStateBackend(b);
  EXPECT_TRUE(backend.ok()) << backend.status();
  std::unique_ptr<StateBackend> store = *std::move(backend);
  if (flaky != nullptr) {
    auto wrapped = std::make_unique<FlakyBackend>(std::move(store));
    *flaky = wrapped.get();
    store = std::move(wrapped);
  }
  SessionJournalConfig c;
  c.replica = replica;
  c.holder_timeout = holder_timeout;
  c.heartbeat_interval = holder_timeout / 4;
  auto j = SessionJournal::Create(c, std::move(store));
  EXPECT_TRUE(j.ok()) << j.status();
  return *std::move(j);
}

// AfterDurable's answer, waited for.
std::pair<absl::Status, int64_t> Durable(SessionJournal* j, const std::string& id, int64_t position) {
  absl::Notification done;
  std::pair<absl::Status, int64_t> out;
  j->AfterDurable(id, position, [&](absl::Status s, int64_t have) {
    out = {s, have};
    done.Notify();
  });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  return out;
}

SessionMeta Meta(const std::string& id, const std::string& owner = "alice") {
  return SessionMeta{id, owner, 16, absl::Seconds(60), absl::FromUnixSeconds(1700000000), {{"k", "v"}}};
}

std::string Snapshot(int64_t position, std::vector<int> pending, std::string state) {
  SessionExport e;
  e.fingerprint = "fake-256";
  e.position = position;
  e.pending = std::move(pending);
  e.state = std::move(state);
  return EncodeSessionExport(e);
}

void Corrupt(const fs::path& file, size_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x5a));
}

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

// The scheduler with a journal and offload, against the fake engine.
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

// A done callback's status, once called.
struct Answer {
  absl::Notification called;
  absl::Status status;
  SessionJournal::Done Done() {
    return [this](absl::Status s) {
      status = s;
      called.Notify();
    };
  }
  bool Wait() { return called.WaitForNotificationWithTimeout(absl::Seconds(30)); }
};

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

class DurableSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = TempDir("sched"); }
  void TearDown() override {
    scheduler_.reset();
    journal_.reset();
    fs::remove_all(dir_);
  }
  void Make(SessionTableConfig table_config, SchedulerConfig config = {}) {
    journal_ = Open(dir_, "r1", journal_holder_timeout_, flaky_journal_ ? &flaky_ : nullptr);
    table_config.has_state_store = true;
    table_ = std::make_unique<SessionTable>(table_config);
    scheduler_ = std::make_unique<Scheduler>(config, &engine_, table_.get(), &tokenizer_, nullptr);
    scheduler_->SetJournal(journal_.get());
    scheduler_->Start();
  }
  // As the service makes a durable session: busy until its creation is written.
  std::string NewSession() {
    auto lease = table_->CreateAcquired("", *engine_.NewSession(64), absl::ZeroDuration(), {}, absl::Now(), "",
                                        /*durable=*/true);
    EXPECT_TRUE(lease.ok()) << lease.status();
    const std::string id = lease->id;
    auto info = table_->Get("", id);
    auto held = std::make_shared<SessionLease>(*std::move(lease));
    absl::Notification written;
    journal_->RecordCreate(SessionMeta{id, "", 64, info->idle_ttl, info->created, {}}, Snapshot(0, {}, ""),
                           [&, held](absl::Status s) {
                             EXPECT_TRUE(s.ok()) << s;
                             table_->Release(std::move(*held), absl::Now());
                             written.Notify();
                           });
    EXPECT_TRUE(written.WaitForNotificationWithTimeout(absl::Seconds(30)));
    return id;
  }
  absl::Status Generate(const std::string& id, std::vector<int> input, int n, std::vector<int>* out = nullptr) {
    auto lease = table_->Acquire("", id, absl::Now());
    if (!lease.ok()) return lease.status();
    GenerateSpec spec;
    spec.input = std::move(input);
    spec.max_new_tokens = n;
    testing::Outcome o;
    auto job = scheduler_->SubmitGenerate(*std::move(lease), false, std::move(spec), o.Callbacks());
    if (!job.ok()) return job.status();
    o.Wait();
    if (out) out->insert(out->end(), o.ids.begin(), o.ids.end());
    return o.status;
  }
  absl::Status Rewind(const std::string& id, int64_t position) {
    auto lease = table_->Acquire("", id, absl::Now());
    if (!lease.ok()) return lease.status();
    testing::Outcome o;
    auto job = scheduler_->SubmitRewind(*std::move(lease), position, o.Callbacks());
    if (!job.ok()) return job.status();
    o.Wait();
    return o.status;
  }
  // Polls the store's tiers until `ok` holds (true) or 10 s pass (false).
  bool WaitForTiers(const std::function<bool(const SessionTable::TierCounts&)>& ok) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!ok(table_->tiers())) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }
  // The history the journal rebuilds: the image's, plus what replays onto it.
  std::vector<int> JournalHistory(const std::string& id) {
    EXPECT_TRUE(journal_->Flush().ok());
    auto r = journal_->Load(id);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<int> pending;
    auto idle = IdleFromRecord(*r, &pending);
    auto state = idle->state.empty() ? engine_.NewSession(idle->mem_len) : engine_.RestoreSession(idle->state);
    std::vector<int> h = static_cast<FakeSession*>(state->get())->history;
    h.insert(h.end(), idle->feed.begin(), idle->feed.end());
    h.insert(h.end(), pending.begin(), pending.end());
    return h;
  }

  std::string dir_;
  absl::Duration journal_holder_timeout_ = absl::Seconds(10);
  bool flaky_journal_ = false;  // Make() opens the journal on a FlakyBackend (flaky_)
  FlakyBackend* flaky_ = nullptr;
  FakeEngine engine_;
  Tokenizer tokenizer_ = Tokenizer::Byte();
  std::unique_ptr<SessionJournal> journal_;
  std::unique_ptr<SessionTable> table_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(DurableSchedulerTest, TheJournalHoldsExactlyTheHistoryEvenAcrossSnapshots) {
  SchedulerConfig config;
  config.snapshot_tokens = 5;  // several snapshots along the way
  Make(SessionTableConfig{}, config);
  const std::string id = NewSession();
  std::vector<int> seen;
  ASSERT_TRUE(Generate(id, {'a', 'b'}, 3, &seen).ok());
  ASSERT_TRUE(Generate(id, {}, 4, &seen).ok());
  ASSERT_TRUE(Generate(id, {'x'}, 2, &seen).ok());
  std::vector<int> want = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'x', 'y', 'z'};
  EXPECT_EQ(JournalHistory(id), want);
  EXPECT_EQ(table_->Get("", id)->position, 12);
  // A snapshot was taken.
  auto r = journal_->Load(id);
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r->image.position, 0);
}

TEST_F(DurableSchedulerTest, ARewindIsJournaledAndSurvivesARestartWithTheWholeHistory) {
  SchedulerConfig config;
  config.snapshot_tokens = 3;
  SessionTableConfig tc;
  tc.history_tokens = 4;  // memory keeps little: going back further reads the store's log
  tc.checkpoints.budget_bytes = 0;
  Make(tc, config);
  const std::string id = NewSession();
  ASSERT_TRUE(Generate(id, {'a', 'b'}, 3).ok());
  ASSERT_TRUE(Generate(id, {}, 4).ok());  // a..i
  absl::Status s = Rewind(id, 2);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(table_->Get("", id)->position, 2);
  EXPECT_EQ(JournalHistory(id), (std::vector<int>{'a', 'b'}));
  std::vector<int> seen;
  ASSERT_TRUE(Generate(id, {'x'}, 1, &seen).ok());
  EXPECT_EQ(seen, (std::vector<int>{'y'}));

  // A restart: the session comes back with its history, and goes back further.
  scheduler_.reset();
  journal_.reset();
  table_.reset();
  Make(tc, config);
  auto recovered = RecoverSessions(journal_.get(), table_.get(), engine_.fingerprint());
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  ASSERT_EQ(*recovered, 1);
  EXPECT_EQ(table_->Get("", id)->position, 4);
  s = Rewind(id, 1);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(JournalHistory(id), (std::vector<int>{'a'}));
  seen.clear();
  ASSERT_TRUE(Generate(id, {}, 2, &seen).ok());
  EXPECT_EQ(seen, (std::vector<int>{'b', 'c'}));
}

TEST_F(DurableSchedulerTest, ARewindTheStoreCannotTakeLeavesTheSessionAsItWas) {
  journal_holder_timeout_ = absl::Milliseconds(40);
  flaky_journal_ = true;
  Make(SessionTableConfig{});
  const std::string id = NewSession();
  ASSERT_TRUE(Generate(id, {'a', 'b'}, 3).ok());  // a..e
  flaky_->failing = true;
  absl::Status s = Rewind(id, 2);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_EQ(table_->Get("", id)->position, 5);
  EXPECT_FALSE(table_->Get("", id)->busy);
  flaky_->failing = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!journal_->Writable().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  std::vector<int> seen;
  ASSERT_TRUE(Generate(id, {}, 1, &seen).ok());
  EXPECT_EQ(seen, (std::vector<int>{'f'})) << "it goes on from e: the rewind did not happen";
  EXPECT_EQ(JournalHistory(id), (std::vector<int>{'a', 'b', 'c', 'd', 'e', 'f'}));
}

// Regression (issue 13, 2): a request refused UNAVAILABLE by a failing store
// still changed the in-memory session (and later the store).
TEST_F(DurableSchedulerTest, AStoreFailureRollsTheSessionBackAndRefusesChangesUntilItRecovers) {
  journal_holder_timeout_ = absl::Milliseconds(40);  // heartbeats every 10 ms
  flaky_journal_ = true;
  Make(SessionTableConfig{});
  const std::string id = NewSession();
  std::vector<int> seen;
  ASSERT_TRUE(Generate(id, {'a', 'b'}, 3, &seen).ok());
  ASSERT_EQ(table_->Get("", id)->position, 5);
  flaky_->failing = true;
  std::vector<int> lost;
  absl::Status s = Generate(id, {'x'}, 5, &lost);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(lost.empty()) << "no token reaches a client before it is written";
  EXPECT_EQ(table_->Get("", id)->position, 5);
  s = Generate(id, {'y'}, 1);  // refused before anything runs: read-only until the store recovers
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("read-only"), std::string::npos) << s;
  EXPECT_EQ(table_->Get("", id)->position, 5);
  flaky_->failing = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!journal_->Writable().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(journal_->Writable().ok());
  seen.clear();
  absl::Status resumed = Generate(id, {}, 2, &seen);
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_EQ(seen, (std::vector<int>{'f', 'g'})) << "it goes on from e, as if 'x' had never been sent";
  EXPECT_EQ(JournalHistory(id), (std::vector<int>{'a', 'b', 'c', 'd', 'e', 'f', 'g'}));
  EXPECT_EQ(table_->Get("", id)->position, 7);
}

// Regression (issue 29): a generation refused while the store hung was
// written anyway when it came back ("the state store has position 32,
// expected 27", then the session went on from the refused history). Now
// the answer waits until the journal knows what landed.
TEST_F(DurableSchedulerTest, AGenerationWhoseWritesHaveAnUnknownOutcomeIsAnsweredByWhatLanded) {
  journal_holder_timeout_ = absl::Milliseconds(40);  // heartbeats every 10 ms
  flaky_journal_ = true;
  Make(SessionTableConfig{});
  const std::string id = NewSession();
  ASSERT_TRUE(Generate(id, {'a', 'b'}, 3).ok());  // a..e
  int64_t position = 5;
  for (const bool lands : {false, true}) {
    SCOPED_TRACE(lands ? "the store applies what it had" : "the store drops what it had");
    flaky_->Pause(/*writes_only=*/true);  // the heartbeats go on: the request is not refused up front
    absl::Status status;
    std::vector<int> seen;
    std::thread client([&] { status = Generate(id, {'x'}, 3, &seen); });
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (flaky_->late_writes() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    EXPECT_GT(flaky_->late_writes(), 0) << "the generation's first write reached the store";
    EXPECT_TRUE(table_->Get("", id)->busy) << "undecided: the session waits";
    EXPECT_EQ(table_->Get("", id)->position, position);
    flaky_->Resume(lands);
    client.join();
    if (HasFailure()) return;
    // What landed is acknowledged; what did not is sent again once the
    // session is fenced again: either way every token, late.
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_EQ(seen, (std::vector<int>{'y', 'z', '{'}));
    position += 4;
    EXPECT_EQ(table_->Get("", id)->position, position);
  }
  std::vector<int> next;
  ASSERT_TRUE(Generate(id, {}, 1, &next).ok());
  EXPECT_EQ(next, (std::vector<int>{'|'}));
  EXPECT_EQ(JournalHistory(id),
            (std::vector<int>{'a', 'b', 'c', 'd', 'e', 'x', 'y', 'z', '{', 'x', 'y', 'z', '{', '|'}));
}

TEST_F(DurableSchedulerTest, OffloadedSessionsComeBackExactlyFromHostAndFromTheStore) {
  SessionTableConfig sc;
  sc.memory_budget_bytes = 63 * 8;   // one fake session's full window
  sc.host_memory_budget_bytes = 40;  // about one offloaded fake image
  Make(sc);
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back(NewSession());
    ASSERT_TRUE(Generate(ids.back(), {10 * i, 10 * i + 1}, 2).ok());
  }
  // The engine thread offloads right after each step; wait until it has.
  ASSERT_TRUE(WaitForTiers(
      [](const SessionTable::TierCounts& t) { return t.device <= 1 && t.host >= 1 && t.state_store >= 1; }));
  // Every session continues as if it never left: the fake's next token is last + 1.
  for (int i = 0; i < 6; ++i) {
    std::vector<int> seen;
    ASSERT_TRUE(Generate(ids[i], {}, 2, &seen).ok()) << i;
    EXPECT_EQ(seen, (std::vector<int>{10 * i + 4, 10 * i + 5})) << i;
    EXPECT_EQ(table_->Get("", ids[i])->position, 6) << i;
  }
}

TEST_F(DurableSchedulerTest, ASessionAnotherReplicaAsksForIsHandedOverExactly) {
  SessionTableConfig sc;
  journal_holder_timeout_ = absl::Milliseconds(40);  // beats (and looks for requests) every 10 ms
  Make(sc);
  const std::string id = NewSession();
  ASSERT_TRUE(Generate(id, {'a', 'b'}, 3).ok());
  auto b = Open(dir_, "b");
  EXPECT_TRUE(absl::IsUnavailable(b->Adopt(id, "").status()));
  // The engine thread hands it over within a heartbeat and a tick.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (table_->Get("", id).ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_FALSE(table_->Get("", id).ok()) << "not handed over";
  ASSERT_TRUE(journal_->Flush().ok());
  auto won = b->Adopt(id, "");
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_EQ(won->position(), 5);
  EXPECT_EQ(won->tail.size(), 0u) << "a snapshot at the hand-over: nothing to replay";
  EXPECT_EQ(JournalHistory(id), (std::vector<int>{'a', 'b', 'c', 'd', 'e'}));
}

// Regression: a recovered session's count of logged tokens started at 0, so
// a server that crashed more often than every snapshot_tokens never folded
// its logs.
TEST_F(DurableSchedulerTest, ARecoveredSessionCountsTheLogItWasRecoveredWith) {
  SchedulerConfig config;
  config.snapshot_tokens = 8;
  Make(SessionTableConfig{}, config);
  const std::string id = NewSession();
  ASSERT_TRUE(Generate(id, {'a', 'b', 'c'}, 3).ok());  // 6 tokens logged, no snapshot yet
  ASSERT_TRUE(journal_->Flush().ok());
  ASSERT_EQ(journal_->Load(id)->image.position, 0);
  // A restart: a new store recovers the session from the journal.
  scheduler_.reset();
  table_ = std::make_unique<SessionTable>(SessionTableConfig{});
  ASSERT_EQ(*RecoverSessions(journal_.get(), table_.get(), engine_.fingerprint()), 1);
  scheduler_ = std::make_unique<Scheduler>(config, &engine_, table_.get(), &tokenizer_, nullptr);
  scheduler_->SetJournal(journal_.get());
  scheduler_->Start();
  ASSERT_TRUE(Generate(id, {}, 2).ok());  // 6 + 2 = 8 logged: the log is folded
  ASSERT_TRUE(journal_->Flush().ok());
  auto r = journal_->Load(id);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->image.position, 8);
  EXPECT_TRUE(r->tail.empty());
  EXPECT_EQ(JournalHistory(id), (std::vector<int>{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}));
}

// Regression: the journal outlives the scheduler at shutdown, and its writer
// thread went on calling the scheduler's hand-over handler after the
// scheduler was gone (AddressSanitizer: stack-use-after-scope in txl-server).
TEST_F(DurableSchedulerTest, TheJournalNoLongerCallsASchedulerThatIsGone) {
  journal_holder_timeout_ = absl::Milliseconds(40);  // beats (and looks for requests) every 10 ms
  Make(SessionTableConfig{});
  const std::string id = NewSession();
  ASSERT_TRUE(Generate(id, {'a'}, 1).ok());
  scheduler_.reset();  // the store keeps the session; nobody will hand it over now
  auto b = Open(dir_, "b");
  EXPECT_TRUE(absl::IsUnavailable(b->Adopt(id, "").status()));  // leaves a "wanted" key
  // Let the writer see the request at several heartbeats.
  StateBackendConfig bc;
  bc.spec = "dir:" + dir_;
  auto raw = OpenStateBackend(bc);
  ASSERT_TRUE(raw.ok());
  for (int beats = 0; beats < 5;) {
    const std::string before = *(*raw)->Get("replicas/r1");
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (*(*raw)->Get("replicas/r1") == before && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
    ++beats;
  }
  EXPECT_TRUE(table_->Get("", id).ok()) << "no scheduler: nothing was handed over";
}

// Regression: a request on a session the engine thread was offloading at
// that moment got ABORTED (busy), as if another request held it.
TEST(SessionTableOffloadTest, ARequestDuringAnOffloadGetsTheSessionNotAborted) {
  FakeEngine engine;
  SessionTableConfig config;
  config.memory_budget_bytes = 63 * 8;
  config.host_memory_budget_bytes = 1 << 20;
  SessionTable table(config);
  auto info = table.Create("", *engine.NewSession(64), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(info.ok());
  std::unique_ptr<SessionState> state = table.BeginOffload(info->id);
  ASSERT_NE(state, nullptr);
  auto lease = table.Acquire("", info->id, absl::Now());  // while the image is being made
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->state, nullptr);
  auto idle = std::make_shared<IdleSession>();
  idle->mem_len = 64;
  ASSERT_TRUE(state->AppendTo(&idle->state).ok());
  table.FinishOffload(info->id, idle);
  // The engine thread, running the request next, finds the image.
  EXPECT_EQ(table.TakeIdle(info->id), idle);
  lease->state = *engine.RestoreSession(idle->state);
  table.Release(*std::move(lease), absl::Now());
  EXPECT_EQ(table.tiers().device, 1);
  EXPECT_EQ(table.reserved_bytes(), 63 * 8);
}

TEST_F(DurableSchedulerTest, DamagedStateInTheStoreEndsTheSessionWithDataLoss) {
  SessionTableConfig sc;
  sc.memory_budget_bytes = 63 * 8;
  sc.host_memory_budget_bytes = 1;  // everything idle goes to the store
  Make(sc);
  const std::string a = NewSession(), b = NewSession();
  ASSERT_TRUE(Generate(a, {1}, 1).ok());
  ASSERT_TRUE(Generate(b, {1}, 1).ok());  // pushes a out to the store
  ASSERT_TRUE(WaitForTiers([](const SessionTable::TierCounts& t) { return t.state_store == 1; }));
  ASSERT_TRUE(journal_->Flush().ok());
  Corrupt(fs::path(dir_) / "sessions" / a / "log", 13);
  absl::Status s = Generate(a, {2}, 1);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_TRUE(absl::IsNotFound(table_->Get("", a).status())) << "a damaged session is not kept";
  EXPECT_TRUE(Generate(b, {2}, 1).ok());
}

}  // namespace
}  // namespace txl
