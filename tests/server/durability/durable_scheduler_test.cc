// The scheduler with a journal and with offload, against the fake engine
// (its state is its history, so "rebuilt exactly" is checkable): what the
// journal holds, rewinds, store failures and unknown outcomes, sessions
// offloaded to host memory and to the store, and hand-overs.
#include "server/batching/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/core/readmit_waiting.h"
#include "server/durability/recovery.h"
#include "server/durability/session_journal.h"
#include "server/durability/state_backend.h"
#include "server/engine/model_repository.h"
#include "server/engine/model_source.h"
#include "tests/server/durability/journal_fixture.h"
#include "tests/server/fake_engine.h"
#include "tests/server/job_outcome.h"

namespace txl {
namespace {

namespace fs = std::filesystem;
using testing::Corrupt;
using testing::FakeEngine;
using testing::FakeSession;
using testing::FlakyBackend;
using testing::Open;
using testing::Snapshot;
using testing::TempDir;

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
    scheduler_ = std::make_unique<Scheduler>(config, table_.get(), nullptr);
    scheduler_->SetJournal(journal_.get());
    scheduler_->Start();
  }
  // As the service makes a durable session: busy until its creation is written.
  std::string NewSession(int64_t mem_len = 64, const std::string& model = "") {
    auto lease =
        table_->CreateAcquired("", served_, *engine_.NewSession(mem_len), absl::ZeroDuration(), {}, absl::Now(), "",
                               /*durable=*/true);
    EXPECT_TRUE(lease.ok()) << lease.status();
    const std::string id = lease->id;
    auto info = table_->Get("", id);
    auto held = std::make_shared<SessionLease>(*std::move(lease));
    absl::Notification written;
    journal_->RecordCreate(SessionMeta{id, "", mem_len, info->idle_ttl, info->created, {}, model}, Snapshot(0, {}, ""),
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
    auto job = scheduler_->SubmitGenerate(*std::move(lease), std::move(spec), o.Callbacks());
    if (!job.ok()) return job.status();
    o.Wait();
    if (out) out->insert(out->end(), o.ids.begin(), o.ids.end());
    return o.status;
  }
  absl::Status Rewind(const std::string& id, int64_t position) {
    auto lease = table_->Acquire("", id, absl::Now());
    if (!lease.ok()) return lease.status();
    testing::Outcome o;
    auto job = scheduler_->SubmitRewind(*std::move(lease), position, o.Ended());
    if (!job.ok()) return job.status();
    o.Wait();
    return o.status;
  }
  // A new session table and scheduler that recover the journal's sessions, as
  // a restart does; returns how many.
  int RestartOnTheSameJournal(SchedulerConfig config, std::shared_ptr<ServedModel> served = nullptr,
                              SessionTableConfig table_config = {}) {
    scheduler_.reset();
    table_ = std::make_unique<SessionTable>(table_config);
    const std::unique_ptr<ModelSource> models = SingleModel(served ? served : served_);
    auto recovered = RecoverSessions(journal_.get(), table_.get(), RecordsOf(models.get()));
    EXPECT_TRUE(recovered.ok()) << recovered.status();
    scheduler_ = std::make_unique<Scheduler>(config, table_.get(), nullptr);
    scheduler_->SetJournal(journal_.get());
    scheduler_->Start();
    return recovered.ok() ? *recovered : -1;
  }
  // A restart whose repository has no room for any session's version: they
  // all wait (RecordsOf's RESOURCE_EXHAUSTED), out of the new table; the
  // scheduler runs again.
  void RestartWithNoRoom(SessionTableConfig table_config = {}) {
    scheduler_.reset();
    table_config.has_state_store = true;
    table_ = std::make_unique<SessionTable>(table_config);
    const RecordModel no_room = [](const JournalRecord& r) -> absl::StatusOr<std::shared_ptr<ServedModel>> {
      return absl::ResourceExhaustedError(absl::StrCat("session ", r.meta.id, ": its version m@1 does not fit"));
    };
    auto recovered = RecoverSessions(journal_.get(), table_.get(), no_room);
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    EXPECT_EQ(*recovered, 0);
    scheduler_ = std::make_unique<Scheduler>(SchedulerConfig{}, table_.get(), nullptr);
    scheduler_->SetJournal(journal_.get());
    scheduler_->Start();
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
  // Returns once the engine thread has run a whole tick (expiry, hand-overs)
  // since the call: a session that expires at once goes only at a tick, and
  // a second one only at the tick after the one that took the first.
  void WaitForATick() {
    for (int witness = 0; witness < 2; ++witness) {
      auto lease = table_->CreateAcquired("", served_, *engine_.NewSession(8), absl::Milliseconds(1), {}, absl::Now(),
                                          "", /*durable=*/false);
      ASSERT_TRUE(lease.ok()) << lease.status();
      const std::string id = lease->id;
      table_->Release(*std::move(lease), absl::Now());
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      while (table_->Get("", id).ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
      ASSERT_FALSE(table_->Get("", id).ok()) << "no tick in 30 s";
    }
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

  // For tests that wait for a heartbeat (the store writable again, a
  // hand-over asked for): beats every 250 ms. Not shorter: a gap between
  // beats of over half the timeout is a pause, and CheckHold then refuses
  // requests until the next beat. At 40 ms, CI's loaded 2-core runs saw
  // such gaps refuse requests these tests expect to be served
  // (ARewindTheStoreCannotTakeLeavesTheSessionAsItWas's first Generate).
  static constexpr absl::Duration kQuickBeats = absl::Seconds(1);

  std::string dir_;
  absl::Duration journal_holder_timeout_ = absl::Seconds(10);
  bool flaky_journal_ = false;  // Make() opens the journal on a FlakyBackend (flaky_)
  FlakyBackend* flaky_ = nullptr;
  std::shared_ptr<ServedModel> served_ = testing::FakeServed();
  FakeEngine& engine_ = testing::FakeOf(*served_);
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
  const std::unique_ptr<ModelSource> models = SingleModel(served_);
  auto recovered = RecoverSessions(journal_.get(), table_.get(), RecordsOf(models.get()));
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

// A session whose version does not fit the model memory budget at start-up
// (RecordsOf's RESOURCE_EXHAUSTED) is not served but stays held by this
// replica, so that a later restart with room recovers it; its owner is told
// why until its version is served here.
TEST_F(DurableSchedulerTest, ASessionWhoseVersionDoesNotFitWaitsHeldUntilARestartWithRoom) {
  Make(SessionTableConfig{});
  const std::string id = NewSession();
  ASSERT_TRUE(Generate(id, {'a', 'b'}, 2).ok());
  ASSERT_TRUE(journal_->Flush().ok());
  const std::string fingerprint = engine_.fingerprint();
  const RecordModel no_room = [](const JournalRecord& r) -> absl::StatusOr<std::shared_ptr<ServedModel>> {
    return absl::ResourceExhaustedError(absl::StrCat("session ", r.meta.id, ": its version m@1 does not fit"));
  };
  const auto wait_at_restart = [&] {
    scheduler_.reset();
    table_ = std::make_unique<SessionTable>(SessionTableConfig{});
    auto recovered = RecoverSessions(journal_.get(), table_.get(), no_room);
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    EXPECT_EQ(*recovered, 0);
  };
  wait_at_restart();
  EXPECT_EQ(journal_->waiting(), 1);
  EXPECT_FALSE(table_->Get("", id).ok());
  std::vector<std::string> asked;
  const auto not_served = [&](const std::string& f) {
    asked.push_back(f);
    return false;
  };
  const absl::Status told = journal_->Waiting(id, "", not_served);
  EXPECT_EQ(told.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(told.message(), ::testing::HasSubstr("its version m@1 does not fit"));
  EXPECT_THAT(told.message(), ::testing::HasSubstr("comes back once there is room for its version"));
  EXPECT_EQ(asked, std::vector<std::string>{fingerprint});
  EXPECT_TRUE(journal_->Waiting(id, "someone else", not_served).ok());
  ASSERT_TRUE(journal_->Flush().ok());
  auto held = journal_->Held();
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(*held, std::vector<std::string>{id});
  // A restart with room: back, with its history.
  EXPECT_EQ(RestartOnTheSameJournal(SchedulerConfig{}), 1);
  EXPECT_EQ(table_->Get("", id)->position, 4);
  std::vector<int> seen;
  ASSERT_TRUE(Generate(id, {}, 1, &seen).ok());
  EXPECT_EQ(seen, (std::vector<int>{'e'}));
  // Waiting again, the wait ends once its version is served here.
  ASSERT_TRUE(journal_->Flush().ok());
  wait_at_restart();
  EXPECT_TRUE(journal_->Waiting(id, "", [](const std::string&) { return true; }).ok());
  EXPECT_FALSE(journal_->IsWaiting(id));
  EXPECT_EQ(journal_->waiting(), 0);
}

// A repository of model "m", versions 1 (the fixture's engine, so the
// fixture's sessions are on it) and 2, and of model "other", version 1;
// each version counts 100 bytes against a budget of 250, and the policy
// serves the latest version of each: m@1 does not fit beside m@2 and other@1.
class WaitingRepository {
 public:
  explicit WaitingRepository(const std::string& dir, std::shared_ptr<ServedModel> v1) : dir_(dir + "/repo") {
    for (const char* path : {"/m/1", "/m/2", "/other/1"}) {
      fs::create_directories(dir_ + path);
      std::ofstream(dir_ + path + "/model.pt") << "weights";
    }
    VersionLoader loader = [v1](const std::string& name,
                                const RepositoryVersion& v) -> absl::StatusOr<std::shared_ptr<ServedVersion>> {
      if (name == "m" && v.version == 1) return std::shared_ptr<ServedVersion>(v1);
      return std::shared_ptr<ServedVersion>(testing::FakeServed(name, v.version, name == "m" ? 300 : 400));
    };
    VersionSizer sizer = [this](const RepositoryVersion&) -> absl::StatusOr<int64_t> {
      sized.fetch_add(1);
      return 100;
    };
    auto r = ModelRepository::Create({dir_, *ParseVersionPolicy("latest"), 250}, loader, sizer);
    EXPECT_TRUE(r.ok()) << r.status();
    repository = *std::move(r);
    models = RepositoryModels(repository.get());
  }
  std::atomic<int> sized{0};  // the sizer's calls
  std::unique_ptr<ModelRepository> repository;
  std::unique_ptr<ModelSource> models;

 private:
  const std::string dir_;
};

// A session recovered waiting for room for its version comes back with no
// restart once room is made: WaitingReadmitter keeps the version and adopts
// the session on it, and it goes on exactly. Until then, the readmitter
// does not size the refused version again for nothing, and it leaves a
// model an operator unloaded alone.
TEST_F(DurableSchedulerTest, AWaitingSessionComesBackWithoutARestartOnceThereIsRoom) {
  Make(SessionTableConfig{});
  const std::string id = NewSession(64, "m@1");
  ASSERT_TRUE(Generate(id, {'a', 'b'}, 2).ok());  // a b c d
  ASSERT_TRUE(journal_->Flush().ok());
  WaitingRepository repo(dir_, testing::FakeServed("m", 1));
  ASSERT_NE(repo.repository, nullptr);
  scheduler_.reset();
  table_ = std::make_unique<SessionTable>(SessionTableConfig{});
  auto recovered = RecoverSessions(journal_.get(), table_.get(), RecordsOf(repo.models.get(), repo.repository.get()));
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(*recovered, 0);
  ASSERT_EQ(journal_->waiting(), 1);
  scheduler_ = std::make_unique<Scheduler>(SchedulerConfig{}, table_.get(), nullptr);
  scheduler_->SetJournal(journal_.get());
  scheduler_->Start();

  WaitingReadmitter readmitter(journal_.get(), repo.repository.get(), scheduler_.get());
  int sized = repo.sized.load();
  EXPECT_EQ(readmitter.Run().submitted, 0);  // still no room
  EXPECT_EQ(repo.sized.load(), sized + 1);
  EXPECT_EQ(readmitter.Run().submitted, 0);
  EXPECT_EQ(repo.sized.load(), sized + 1) << "nothing was freed: the refused version is not sized again";
  // Unloading m itself makes room, but an unloaded model is not loaded again behind the operator's back.
  ASSERT_TRUE(repo.repository->Unload("m").ok());
  EXPECT_EQ(readmitter.Run().submitted, 0);
  EXPECT_EQ(repo.sized.load(), sized + 1);
  // Loaded again (m@2 is back): no room again, and nothing sized for it.
  ASSERT_TRUE(repo.repository->Load("m").ok());
  sized = repo.sized.load();
  EXPECT_EQ(readmitter.Run().submitted, 0);
  EXPECT_EQ(repo.sized.load(), sized);
  EXPECT_EQ(journal_->waiting(), 1);

  // Room: the other model is unloaded (nothing holds it, so it is freed at once).
  ASSERT_TRUE(repo.repository->Unload("other").ok());
  EXPECT_EQ(readmitter.Run().submitted, 1);
  EXPECT_EQ(journal_->waiting(), 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!table_->Get("", id).ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  auto info = table_->Get("", id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->model, "m@1");
  EXPECT_EQ(info->position, 4);
  std::vector<int> seen;
  ASSERT_TRUE(Generate(id, {}, 1, &seen).ok());
  EXPECT_EQ(seen, (std::vector<int>{'e'}));
}

// A readmission with the store not writable loads nothing and tries again
// after the backoff; a version whose file is gone lets its session go, as a
// restart does.
TEST_F(DurableSchedulerTest, AReadmissionWaitsForTheStoreAndLetsGoOfASessionWhoseVersionIsGone) {
  journal_holder_timeout_ = kQuickBeats;
  flaky_journal_ = true;
  Make(SessionTableConfig{});
  const std::string id = NewSession(64, "m@1");
  ASSERT_TRUE(journal_->Flush().ok());
  RestartWithNoRoom();
  ASSERT_EQ(journal_->waiting(), 1);
  WaitingRepository repo(dir_, testing::FakeServed("m", 1));
  ASSERT_NE(repo.repository, nullptr);
  ASSERT_TRUE(repo.repository->Unload("other").ok());  // room from now on
  WaitingReadmitter readmitter(journal_.get(), repo.repository.get(), scheduler_.get());
  flaky_->failing = true;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (journal_->Writable().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_FALSE(journal_->Writable().ok());
  const int sized = repo.sized.load();
  const Readmitted r = readmitter.Run();
  EXPECT_EQ(r.submitted, 0);
  EXPECT_EQ(r.again, kWaitingRetryBackoff);
  EXPECT_EQ(repo.sized.load(), sized) << "nothing loaded while the store cannot take the adoption";
  EXPECT_EQ(journal_->waiting(), 1);
  flaky_->failing = false;
  while (!journal_->Writable().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(journal_->Writable().ok());
  // Its version's file is gone: let go (another replica serving it may adopt it), not waiting.
  fs::remove_all(dir_ + "/repo/m/1");
  EXPECT_EQ(readmitter.Run().submitted, 0);
  EXPECT_EQ(journal_->waiting(), 0);
  ASSERT_TRUE(journal_->Flush().ok());
  auto held = journal_->Held();
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(held->empty()) << "released";
}

// A waiting session is out of the table, so the table's expiry never sees
// it: the tick expires it from the journal, and it is gone from the store.
TEST_F(DurableSchedulerTest, AWaitingSessionExpiresAtATickWhenItsTtlRunsOut) {
  Make(SessionTableConfig{});
  const std::string id = NewSession();
  ASSERT_TRUE(journal_->Flush().ok());
  SessionTableConfig short_lived;
  short_lived.max_ttl = absl::Milliseconds(1);  // its recorded ttl (10 min) is cut to this, as AddIdle would
  RestartWithNoRoom(short_lived);
  ASSERT_EQ(journal_->waiting(), 1);
  WaitForATick();
  EXPECT_EQ(journal_->waiting(), 0);
  ASSERT_TRUE(journal_->Flush().ok());
  EXPECT_TRUE(absl::IsNotFound(journal_->Load(id).status())) << journal_->Load(id).status();
}

TEST_F(DurableSchedulerTest, ARewindTheStoreCannotTakeLeavesTheSessionAsItWas) {
  journal_holder_timeout_ = kQuickBeats;
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
  journal_holder_timeout_ = kQuickBeats;
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
  // Heartbeats every 100 ms. (At 40 ms, one run in 20 of the whole suite under TSan saw its last
  // request refused: a gap of over half the holder timeout between beats makes CheckHold refuse
  // until the next beat, a retry the client is told to make; this test is about unknown
  // outcomes, not about that.)
  journal_holder_timeout_ = absl::Milliseconds(400);
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
  // The store is read-only until the writer's next write succeeds, which
  // may come after the answer above (a request then is told to retry).
  const absl::Time writable_by = absl::Now() + absl::Seconds(30);
  while (!journal_->Writable().ok() && absl::Now() < writable_by) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(journal_->Writable().ok()) << journal_->Writable();
  std::vector<int> next;
  const absl::Status last = Generate(id, {}, 1, &next);
  ASSERT_TRUE(last.ok()) << last;
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
  journal_holder_timeout_ = kQuickBeats;
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

// Regression (store_pauses, under ASan in CI): a replica that came back
// from a pause and found its session taken over was told to let its copy go
// at its next tick; a request adopted the session back before that tick,
// and the tick then let go of the new claim (released it, discarded it):
// the request that adopted it was answered NOT_FOUND.
TEST_F(DurableSchedulerTest, ASessionAdoptedBackBeforeTheTickIsKeptByIt) {
  journal_holder_timeout_ = absl::Milliseconds(200);
  flaky_journal_ = true;
  Make({});
  const std::string id = NewSession();
  ASSERT_TRUE(Generate(id, {'a', 'b'}, 3).ok());
  // This replica's store stops answering (as a paused replica's would); b
  // takes the session over once its heartbeat is old, goes on, lets it go.
  flaky_->Pause();
  auto b = Open(dir_, "b", journal_holder_timeout_);
  absl::StatusOr<JournalRecord> taken = testing::TakeOver(b.get(), id, "");
  ASSERT_TRUE(taken.ok()) << taken.status();
  b->RecordTokens(id, taken->position(), {'x'});
  b->RecordRelease(id);
  ASSERT_TRUE(b->Flush().ok());
  // Right after a tick (the next is a second away) it answers again, and
  // finds its hold lost: its engine thread is told to let the copy go.
  WaitForATick();
  flaky_->Resume(/*apply_late=*/false);
  ASSERT_TRUE(testing::FindsItLost(journal_.get(), id));
  // A request before that tick throws the copy away (NOT_FOUND: the tick
  // came first after all), and adopts b's history.
  absl::Status stale = Generate(id, {'y'}, 1);
  EXPECT_TRUE(absl::IsUnavailable(stale) || absl::IsNotFound(stale)) << stale;
  EXPECT_FALSE(table_->Get("", id).ok()) << "the lost copy was kept";
  const std::unique_ptr<ModelSource> models = SingleModel(served_);
  testing::Outcome adopted;
  ASSERT_TRUE(scheduler_->SubmitAdopt("", id, RecordsOf(models.get()), adopted.Ended()).ok());
  adopted.Wait();
  ASSERT_TRUE(adopted.status.ok()) << adopted.status;
  // The tick keeps it: it is this replica's again.
  WaitForATick();
  ASSERT_TRUE(table_->Get("", id).ok()) << "the adopted session was let go at the tick";
  std::vector<int> out;
  ASSERT_TRUE(Generate(id, {'y'}, 1, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(JournalHistory(id), (std::vector<int>{'a', 'b', 'c', 'd', 'e', 'x', 'y', out[0]}));
}

// Regression: adoption claimed a session of a model this replica does not
// serve and kept the claim, so no replica could adopt it. Now it is refused
// naming both models and let go.
TEST_F(DurableSchedulerTest, ASessionOfAModelNotServedIsNotAdoptedAndIsLetGo) {
  auto gone = Open(dir_, "gone");
  gone->RecordCreate(SessionMeta{"s1", "", 16, absl::Seconds(60), absl::Now(), {}}, Snapshot(0, {}, ""), nullptr);
  gone->RecordTokens("s1", 0, {4, 5});
  ASSERT_TRUE(gone->Flush().ok());
  gone.reset();  // a clean stop: its sessions may be adopted at once
  Make({});
  const std::unique_ptr<ModelSource> other = SingleModel(testing::FakeServed("other", 1, 128));
  testing::Outcome o;
  ASSERT_TRUE(scheduler_->SubmitAdopt("", "s1", RecordsOf(other.get()), o.Ended()).ok());
  o.Wait();
  EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
  EXPECT_NE(o.status.message().find("session s1: model fake-256 is not served here (serving other@1 fake-128)"),
            std::string::npos)
      << o.status;
  EXPECT_FALSE(table_->Get("", "s1").ok());
  ASSERT_TRUE(journal_->Flush().ok());
  auto serving = Open(dir_, "serving");
  auto won = serving->Adopt("s1", "");
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_EQ(won->tail, (std::vector<int>{4, 5}));
}

// Regression: a restart with another model claimed its sessions and kept
// them, so no replica serving their model could adopt them.
TEST_F(DurableSchedulerTest, ARestartWithAnotherModelLetsItsSessionsGo) {
  Make({});
  const std::string id = NewSession();
  ASSERT_TRUE(Generate(id, {'a', 'b'}, 2).ok());
  EXPECT_EQ(RestartOnTheSameJournal({}, testing::FakeServed("other", 1, 128)), 0);
  ASSERT_TRUE(journal_->Flush().ok());
  auto serving = Open(dir_, "serving");
  auto won = serving->Adopt(id, "");
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_EQ(won->position(), 4);
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
  ASSERT_EQ(RestartOnTheSameJournal(config), 1);  // a new store recovers the session from the journal
  ASSERT_TRUE(Generate(id, {}, 2).ok());          // 6 + 2 = 8 logged: the log is folded
  ASSERT_TRUE(journal_->Flush().ok());
  auto r = journal_->Load(id);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->image.position, 8);
  EXPECT_TRUE(r->tail.empty());
  EXPECT_EQ(JournalHistory(id), (std::vector<int>{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}));
}

// Bounded replay (docs/SESSIONS.md, "Bounded replay"): a session recovered
// from a long log without a snapshot feeds only the log's last
// ReceptiveField tokens when it comes back, and goes on as before.
TEST_F(DurableSchedulerTest, ARecoveredSessionReplaysOnlyTheReceptiveField) {
  SchedulerConfig config;
  config.snapshot_tokens = 1000;  // no snapshot: the whole history is in the log
  Make(SessionTableConfig{}, config);
  const std::string id = NewSession(/*mem_len=*/4);
  std::vector<int> seen;
  ASSERT_TRUE(Generate(id, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, 4, &seen).ok());  // 20 tokens
  ASSERT_TRUE(journal_->Flush().ok());
  ASSERT_EQ(RestartOnTheSameJournal(config), 1);
  int64_t before = 0;
  for (const auto& step : engine_.steps()) before += step.tokens;
  std::vector<int> next;
  ASSERT_TRUE(Generate(id, {}, 1, &next).ok());
  int64_t fed = -before;
  for (const auto& step : engine_.steps()) fed += step.tokens;
  EXPECT_EQ(fed, engine_.ReceptiveField(4) + 1);  // the replay, then the pending token
  EXPECT_EQ(next, std::vector<int>{seen.back() + 1});
  EXPECT_EQ(table_->Get("", id)->position, 21);
}

// Without offload, a session recovered after a restart comes back into
// device memory only within the session memory budget: while sessions
// created since fill it, its request is RESOURCE_EXHAUSTED naming the
// budget, and it stays in the store as it was; once there is room, it comes
// back and goes on. Before, it came back past the budget.
TEST_F(DurableSchedulerTest, ARecoveredSessionComesBackOnlyWithinTheSessionBudget) {
  Make(SessionTableConfig{});
  const std::string id = NewSession(/*mem_len=*/9);
  std::vector<int> seen;
  ASSERT_TRUE(Generate(id, {1, 2, 3}, 2, &seen).ok());
  ASSERT_TRUE(journal_->Flush().ok());
  SessionTableConfig one_window;
  one_window.memory_budget_bytes = engine_.FullMemoryBytes(9);
  ASSERT_EQ(RestartOnTheSameJournal({}, nullptr, one_window), 1);
  const std::string other = NewSession(/*mem_len=*/9);  // fills the budget
  const absl::Status refused = Generate(id, {4}, 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("session_memory_budget"));
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("back into device memory"));
  EXPECT_EQ(table_->reserved_bytes(), engine_.FullMemoryBytes(9)) << "the refused session counts nothing";
  EXPECT_EQ(table_->Get("", id)->position, 5);
  ASSERT_TRUE(table_->Delete("", other).ok());
  std::vector<int> next;
  ASSERT_TRUE(Generate(id, {4}, 1, &next).ok());
  EXPECT_EQ(table_->Get("", id)->position, 7);
  EXPECT_EQ(JournalHistory(id), (std::vector<int>{1, 2, 3, seen[0], seen[1], 4, next[0]}));
}

// Regression: the journal outlives the scheduler at shutdown, and its writer
// thread went on calling the scheduler's hand-over handler after the
// scheduler was gone (AddressSanitizer: stack-use-after-scope in txl-server).
TEST_F(DurableSchedulerTest, TheJournalNoLongerCallsASchedulerThatIsGone) {
  journal_holder_timeout_ = kQuickBeats;
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
  std::shared_ptr<ServedModel> served = testing::FakeServed();
  FakeEngine& engine = testing::FakeOf(*served);
  SessionTableConfig config;
  config.memory_budget_bytes = 63 * 8;
  config.host_memory_budget_bytes = 1 << 20;
  SessionTable table(config);
  auto info = table.Create("", served, *engine.NewSession(64), absl::ZeroDuration(), {}, absl::Now());
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
