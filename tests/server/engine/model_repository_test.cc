// ModelRepository and the version policy against a fake loader: which
// versions load, what a damaged file does, when a version retires and
// unloads, and that Find answers during a slow load.
#include "server/engine/model_repository.h"

#include "server/engine/repository_poller.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/read_file.h"
#include "base/thread_nice.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace txl {
namespace {

using ::testing::HasSubstr;

struct FakeVersion : ServedVersion {
  explicit FakeVersion(int64_t v) : version(v) {}
  ~FakeVersion() override {
    if (on_free) on_free();
  }
  int64_t version;
  std::function<void()> on_free;  // runs on the thread that frees it
};

TEST(VersionPolicyTest, ParsesTheThreeFormsAndNamesABadOne) {
  EXPECT_EQ(ParseVersionPolicy("latest")->latest, 1);
  EXPECT_EQ(ParseVersionPolicy("latest:3")->latest, 3);
  EXPECT_EQ(ParseVersionPolicy("all")->latest, 0);
  for (const char* bad : {"", "newest", "latest:0", "latest:x", "latest:-2", "ALL"}) {
    auto p = ParseVersionPolicy(bad);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(p.status().message(), HasSubstr(absl::StrCat("\"", bad, "\"")));
  }
}

TEST(VersionPolicyTest, WantsTheNewestCompleteVersions) {
  std::vector<RepositoryVersion> v = {{1, "", true}, {2, "", true}, {3, "", false}, {4, "", true}};
  EXPECT_EQ(WantedVersions(*ParseVersionPolicy("latest"), v), (std::vector<int64_t>{4}));
  EXPECT_EQ(WantedVersions(*ParseVersionPolicy("latest:2"), v), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(WantedVersions(*ParseVersionPolicy("all"), v), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_TRUE(WantedVersions(*ParseVersionPolicy("all"), {}).empty());
}

class ModelRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/model_repository_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Writes NAME/VERSION/model.pt; the fake loader accepts "good" only.
  void Put(const std::string& model, int64_t version, const std::string& bytes = "good") {
    const std::string d = absl::StrCat(dir_, "/", model, "/", version);
    std::filesystem::create_directories(d);
    ASSERT_TRUE(WriteFile(d + "/model.pt", bytes).ok());
  }
  VersionLoader Loader() {
    return [this](const std::string&, const RepositoryVersion& v) -> absl::StatusOr<std::shared_ptr<ServedVersion>> {
      ++loads_;
      auto bytes = ReadFile(v.path);
      if (!bytes.ok()) return bytes.status();
      if (*bytes != "good") return absl::InvalidArgumentError(absl::StrCat(v.path, ": damaged checkpoint"));
      return std::make_shared<FakeVersion>(v.version);
    };
  }
  std::unique_ptr<ModelRepository> Open(const std::string& policy = "latest") {
    auto r = ModelRepository::Create({dir_, *ParseVersionPolicy(policy)}, Loader());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }
  VersionState StateOf(const ModelRepository& r, const std::string& model, int64_t version) {
    for (const VersionStatus& s : r.List()) {
      if (s.model == model && s.version == version) return s.state;
    }
    ADD_FAILURE() << model << " " << version << " not listed";
    return VersionState::kLoading;
  }
  // Loads version 2 only once release_ is notified (loading_ says it started).
  VersionLoader SlowLoader() {
    return [this](const std::string&, const RepositoryVersion& v) -> absl::StatusOr<std::shared_ptr<ServedVersion>> {
      if (v.version == 2) {
        loading_.Notify();
        release_.WaitForNotification();
      }
      return std::make_shared<FakeVersion>(v.version);
    };
  }
  // char version 1 served, and a poll (`poll`, to be joined) loading version 2 until release_.
  std::unique_ptr<ModelRepository> OpenWhileVersion2Loads(std::thread* poll) {
    Put("char", 1);
    auto r = ModelRepository::Create({dir_, {}}, SlowLoader());
    if (!r.ok()) return nullptr;
    Put("char", 2);
    *poll = std::thread([repository = r->get()] { EXPECT_TRUE(repository->Poll().ok()); });
    loading_.WaitForNotification();
    return *std::move(r);
  }
  int64_t Newest(const ModelRepository& r, const std::string& model) {
    auto f = r.Find(model);
    return f.ok() ? f->version : -1;
  }
  std::string dir_;
  std::atomic<int> loads_{0};
  absl::Notification loading_, release_;
};

TEST_F(ModelRepositoryTest, AMissingDirectoryIsNotFoundNamingIt) {
  auto r = ModelRepository::Create({dir_ + "/nope", {}}, Loader());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(dir_ + "/nope"));
}

TEST_F(ModelRepositoryTest, ANewVersionTakesOverAndTheOldOneUnloadsWhenItsLastHolderLetsGo) {
  Put("char", 1);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  auto held = r->Find("char");  // a session bound to version 1
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->version, 1);
  Put("char", 2);
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(Newest(*r, "char"), 2);
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kRetiring);
  auto pinned = r->Find("char", 1);  // takes no new requests
  EXPECT_EQ(pinned.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(pinned.status().message(), HasSubstr("RETIRING: replaced by version 2"));
  EXPECT_EQ(static_cast<FakeVersion*>(held->served.get())->version, 1);  // the holder's is intact
  held->served.reset();
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kUnloaded);
  EXPECT_EQ(loads_, 2);
}

TEST_F(ModelRepositoryTest, ADamagedVersionFailsWithItsReasonAndTheServingOneGoesOn) {
  Put("char", 1);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  Put("char", 2, "half a file");
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(StateOf(*r, "char", 2), VersionState::kFailed);
  EXPECT_EQ(Newest(*r, "char"), 1);  // still serving
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kReady);
  auto two = r->Find("char", 2);
  EXPECT_THAT(two.status().message(), HasSubstr("FAILED"));
  EXPECT_THAT(two.status().message(), HasSubstr("damaged checkpoint"));
  // Polling again does not retry an unchanged file; a changed one is.
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(loads_, 2);
  Put("char", 2, "good");
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(loads_, 3);
  EXPECT_EQ(Newest(*r, "char"), 2);
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kUnloaded);  // nobody held it
}

TEST_F(ModelRepositoryTest, RemovingTheServingVersionBringsBackTheOneBefore) {
  Put("char", 1);
  Put("char", 2);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(Newest(*r, "char"), 2);
  EXPECT_EQ(loads_, 1);  // latest: version 1 was never loaded
  std::filesystem::remove_all(dir_ + "/char/2");
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(Newest(*r, "char"), 1);
  EXPECT_EQ(StateOf(*r, "char", 2), VersionState::kUnloaded);
}

TEST_F(ModelRepositoryTest, PoliciesAndModelsAreSeparate) {
  Put("char", 1);
  Put("char", 2);
  Put("word", 5);
  auto r = Open("all");
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->Find("char", 1).ok());
  EXPECT_TRUE(r->Find("char", 2).ok());
  EXPECT_EQ(Newest(*r, "word"), 5);
  auto none = r->Find("byte");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("\"byte\" is not served (served: char, word)"));
  EXPECT_THAT(r->Find("char", 9).status().message(), HasSubstr("has no version 9"));
}

TEST_F(ModelRepositoryTest, FindAnswersWhileAVersionLoads) {
  std::thread poll;
  auto r = OpenWhileVersion2Loads(&poll);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(Newest(*r, "char"), 1);  // served while version 2 loads
  EXPECT_EQ(StateOf(*r, "char", 2), VersionState::kLoading);
  release_.Notify();
  poll.join();
  EXPECT_EQ(Newest(*r, "char"), 2);
}

// Every version needs 600 bytes of a 1000-byte budget: one fits at a time.
TEST_F(ModelRepositoryTest, AVersionOverTheMemoryBudgetIsRefusedWithTheFiguresUntilTheHolderLetsGo) {
  Put("char", 1);
  auto created = ModelRepository::Create({dir_, *ParseVersionPolicy("latest"), 1000}, Loader(),
                                         [](const RepositoryVersion&) -> absl::StatusOr<int64_t> { return 600; });
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<ModelRepository> r = *std::move(created);
  auto held = r->Find("char");  // a session on version 1
  ASSERT_TRUE(held.ok());
  Put("char", 2);
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(loads_, 1);  // refused before loading
  EXPECT_EQ(StateOf(*r, "char", 2), VersionState::kFailed);
  EXPECT_THAT(
      r->Find("char", 2).status().message(),
      HasSubstr("needs 600 bytes, and --model_memory_budget 1000 has 400 left (char version 1 READY 600 held)"));
  EXPECT_EQ(Newest(*r, "char"), 1);
  // Removed, version 1 stops taking requests but its holder keeps its memory.
  std::filesystem::remove_all(dir_ + "/char/1");
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kRetiring);
  EXPECT_THAT(r->Find("char", 2).status().message(), HasSubstr("char version 1 RETIRING 600 held"));
  EXPECT_EQ(loads_, 1);
  held->served.reset();
  ASSERT_TRUE(r->Poll().ok());  // an unchanged file refused for the budget is tried again
  EXPECT_EQ(loads_, 2);
  EXPECT_EQ(Newest(*r, "char"), 2);
}

// Without a budget every version is still sized (what serve sets aside for
// later loads); a budget set once the start-up versions are loaded refuses
// the loads past it, with where it came from.
TEST_F(ModelRepositoryTest, VersionsAreSizedWithoutABudgetAndABudgetSetLaterRefusesLoadsPastIt) {
  Put("char", 1);
  Put("word", 1);
  auto created = ModelRepository::Create({dir_, *ParseVersionPolicy("latest"), 0}, Loader(),
                                         [](const RepositoryVersion&) -> absl::StatusOr<int64_t> { return 600; });
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<ModelRepository> r = *std::move(created);
  EXPECT_EQ(r->HeldBytes(), 1200);
  ASSERT_TRUE(r->SetMemoryBudget(1500, " (the default)").ok());
  Put("char", 2);
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(StateOf(*r, "char", 2), VersionState::kFailed);
  EXPECT_THAT(r->Find("char", 2).status().message(),
              HasSubstr("needs 600 bytes, and --model_memory_budget 1500 (the default) has 300 left"));
  EXPECT_EQ(r->HeldBytes(), 1200);  // the refused version holds nothing
  ASSERT_TRUE(r->SetMemoryBudget(2400).ok());
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(Newest(*r, "char"), 2);
  EXPECT_EQ(r->HeldBytes(), 1200);  // version 1 retired and, unheld, unloaded
  EXPECT_EQ(r->SetMemoryBudget(-1).code(), absl::StatusCode::kInvalidArgument);
  auto no_sizer = ModelRepository::Create({dir_, {}, 0}, Loader());
  ASSERT_TRUE(no_sizer.ok());
  EXPECT_EQ((*no_sizer)->HeldBytes(), 0);
  EXPECT_EQ((*no_sizer)->SetMemoryBudget(10).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelRepositoryTest, ABudgetNeedsASizerAndCannotBeNegative) {
  Put("char", 1);
  auto no_sizer = ModelRepository::Create({dir_, {}, 1000}, Loader());
  EXPECT_EQ(no_sizer.status().code(), absl::StatusCode::kInvalidArgument);
  auto negative = ModelRepository::Create({dir_, {}, -1}, Loader());
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(), HasSubstr("--model_memory_budget: must be >= 0"));
  auto sizer_fails = ModelRepository::Create({dir_, {}, 1000}, Loader(), [](const RepositoryVersion& v) {
    return absl::StatusOr<int64_t>(absl::DataLossError(v.path + ": cannot read its size"));
  });
  ASSERT_TRUE(sizer_fails.ok());
  EXPECT_THAT((*sizer_fails)->Find("char", 1).status().message(), HasSubstr("FAILED: "));
  EXPECT_THAT((*sizer_fails)->Find("char", 1).status().message(), HasSubstr("cannot read its size"));
  EXPECT_EQ(loads_, 0);
}

TEST_F(ModelRepositoryTest, UnloadStopsNewRequestsAndPollsLeaveTheModelAloneUntilLoad) {
  Put("char", 1);
  Put("word", 1);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  auto held = r->Find("char");
  ASSERT_TRUE(r->Unload("char").ok());
  EXPECT_EQ(r->Find("char").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r->Find("char", 1).status().message(), HasSubstr("RETIRING: unloaded by request"));
  EXPECT_EQ(Newest(*r, "word"), 1);  // the other model goes on
  held->served.reset();
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kUnloaded);
  Put("char", 2);
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(loads_, 2);  // neither version loaded again
  EXPECT_EQ(StateOf(*r, "char", 2), VersionState::kUnloaded);
  ASSERT_TRUE(r->Load("char").ok());
  EXPECT_EQ(Newest(*r, "char"), 2);
  EXPECT_EQ(loads_, 3);
  EXPECT_EQ(r->Unload("nope").code(), absl::StatusCode::kNotFound);
  absl::Status missing = r->Load("nope");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("\"nope\" is not in " + dir_));
}

TEST_F(ModelRepositoryTest, LoadNamesWhyNoVersionIsReady) {
  Put("char", 1, "half a file");
  auto r = Open();
  ASSERT_NE(r, nullptr);
  absl::Status s = r->Load("char");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("\"char\" has no ready version (version 1: "));
  EXPECT_THAT(s.message(), HasSubstr("damaged checkpoint"));
}

TEST_F(ModelRepositoryTest, AnUnloadDuringALoadDropsTheLoadedVersion) {
  std::thread poll;
  auto r = OpenWhileVersion2Loads(&poll);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->Unload("char").ok());  // not ASSERT: the poll thread must be joined
  release_.Notify();
  poll.join();
  EXPECT_EQ(StateOf(*r, "char", 2), VersionState::kUnloaded);
  EXPECT_EQ(r->Find("char").status().code(), absl::StatusCode::kNotFound);
}

// Waits (at most 30 s) until `done` holds; false if it never did.
bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

TEST_F(ModelRepositoryTest, APollerPicksUpAPublishedVersionAndOutlivesAMissingDirectory) {
  Put("char", 1);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  RepositoryPoller poller(r.get(), RepositoryPollerConfig{absl::Milliseconds(5)});
  Put("char", 2);
  ASSERT_TRUE(Eventually([&] { return Newest(*r, "char") == 2; }));
  // The directory gone for a while: polls fail, and the loaded version goes on serving.
  std::filesystem::rename(dir_, dir_ + ".away");
  const int64_t before = poller.polls();
  ASSERT_TRUE(Eventually([&] { return poller.polls() >= before + 2; }));
  EXPECT_EQ(Newest(*r, "char"), 2);
  std::filesystem::rename(dir_ + ".away", dir_);
  Put("char", 3);
  ASSERT_TRUE(Eventually([&] { return Newest(*r, "char") == 3; }));
}

// The follow-up (WaitingReadmitter in the server) runs on the poller's
// thread after each piece of work and each poll, and again once the
// duration it returns has passed, with no poll interval.
TEST_F(ModelRepositoryTest, APollersFollowUpRunsAfterItsWorkAndAgainWhenItAsks) {
  Put("char", 1);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  RepositoryPoller poller(r.get(), RepositoryPollerConfig{absl::InfiniteDuration()});
  absl::Mutex mu;
  std::vector<std::string> seen;  // what ran, in order
  int follow_ups = 0;
  poller.SetFollowUp([&] {
    absl::MutexLock l(&mu);
    seen.push_back("follow-up");
    // The first asks to run again in 10 ms; later ones ask for nothing.
    return ++follow_ups == 1 ? absl::Milliseconds(10) : absl::InfiniteDuration();
  });
  ASSERT_TRUE(poller.Run([&] {
    absl::MutexLock l(&mu);
    seen.push_back("work");
  }));
  {
    absl::MutexLock l(&mu);
    auto twice = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return follow_ups >= 2; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&twice), absl::Seconds(30))) << "no follow-up asked for";
    EXPECT_EQ(seen, (std::vector<std::string>{"work", "follow-up", "follow-up"}));
  }
  poller.SetFollowUp(nullptr);
  absl::Notification ran;
  ASSERT_TRUE(poller.Run([&] { ran.Notify(); }));
  ran.WaitForNotification();
  poller.Stop();
  absl::MutexLock l(&mu);
  EXPECT_EQ(follow_ups, 2) << "none after it was cleared, nor unasked";
}

// The loads run below the engine's priority, and so do the threads a load
// starts (its parallel loops' team): bench/reload.py's R2.
TEST_F(ModelRepositoryTest, APollersWorkAndTheThreadsItStartsRunAtTheLoweredNiceValue) {
  Put("char", 1);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  const absl::StatusOr<int> server = ThisThreadNice();
  ASSERT_TRUE(server.ok()) << server.status();
  // At nice 19 already (a niced runner), every increment keeps 19: the checks still hold.
  for (const int increment : {0, 3, 19}) {
    RepositoryPollerConfig config;
    config.nice_increment = increment;
    RepositoryPoller poller(r.get(), config);
    absl::Notification ran;
    absl::StatusOr<int> seen, started;
    ASSERT_TRUE(poller.Run([&] {
      seen = ThisThreadNice();
      std::thread([&] { started = ThisThreadNice(); }).join();
      ran.Notify();
    }));
    ran.WaitForNotification();
    ASSERT_TRUE(seen.ok() && started.ok());
    EXPECT_EQ(*seen, std::min(19, *server + increment)) << "increment " << increment;
    EXPECT_EQ(*started, *seen) << "increment " << increment;
  }
  EXPECT_EQ(*ThisThreadNice(), *server);  // the caller's own is untouched
}

// A retiring version's last holder may be the engine thread (a session that
// expired): the version is freed on the poller's thread instead; once the
// poller stops, where it is dropped.
TEST_F(ModelRepositoryTest, AVersionLetGoOfIsFreedOnThePollersThread) {
  Put("char", 1);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  auto poller = std::make_unique<RepositoryPoller>(r.get(), RepositoryPollerConfig{});
  r->SetReleaser(poller->Releaser());
  std::thread::id poller_thread;
  absl::Notification asked;
  ASSERT_TRUE(poller->Run([&] {
    poller_thread = std::this_thread::get_id();
    asked.Notify();
  }));
  asked.WaitForNotification();
  auto held = r->Find("char");
  ASSERT_TRUE(held.ok());
  std::thread::id freed_on;
  absl::Notification freed;
  static_cast<FakeVersion&>(*held->served).on_free = [&] {
    freed_on = std::this_thread::get_id();
    freed.Notify();
  };
  Put("char", 2);
  ASSERT_TRUE(r->Poll().ok());  // version 2 ready; version 1 retires, held here
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kRetiring);
  EXPECT_FALSE(freed.HasBeenNotified());
  held->served.reset();  // the last holder lets go, on this thread
  freed.WaitForNotification();
  EXPECT_EQ(freed_on, poller_thread);
  EXPECT_NE(freed_on, std::this_thread::get_id());
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kUnloaded);

  // A stopped poller refuses: the version is freed where it is dropped.
  held = r->Find("char");
  ASSERT_TRUE(held.ok());
  absl::Notification freed_here;
  static_cast<FakeVersion&>(*held->served).on_free = [&] {
    freed_on = std::this_thread::get_id();
    freed_here.Notify();
  };
  poller->Stop();
  ASSERT_TRUE(r->Unload("char").ok());
  held->served.reset();
  ASSERT_TRUE(freed_here.HasBeenNotified());
  EXPECT_EQ(freed_on, std::this_thread::get_id());
  // The releaser may outlive its poller.
  poller.reset();
  Put("char", 3);
  ASSERT_TRUE(r->Load("char").ok());
  held = r->Find("char");
  ASSERT_TRUE(held.ok());
  Put("char", 4);
  ASSERT_TRUE(r->Poll().ok());
  held->served.reset();  // freed here, without the poller
  EXPECT_EQ(StateOf(*r, "char", 3), VersionState::kUnloaded);
}

// Let go of while the poller is busy, a version waits there to be freed: it
// stays RETIRING (and in the memory budget) until then, and a Keep meanwhile
// takes it back without a load.
TEST_F(ModelRepositoryTest, AVersionWaitingToBeFreedIsStillHeld) {
  Put("char", 1);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  RepositoryPoller poller(r.get(), RepositoryPollerConfig{});
  r->SetReleaser(poller.Releaser());
  auto held = r->Find("char");
  ASSERT_TRUE(held.ok());
  absl::Notification freed;
  static_cast<FakeVersion&>(*held->served).on_free = [&] { freed.Notify(); };
  Put("char", 2);
  ASSERT_TRUE(r->Poll().ok());
  absl::Notification busy, go_on;
  ASSERT_TRUE(poller.Run([&] {
    busy.Notify();
    go_on.WaitForNotification();
  }));
  busy.WaitForNotification();
  held->served.reset();  // queued on the busy poller
  EXPECT_FALSE(freed.HasBeenNotified());
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kRetiring);
  const int loads = loads_;
  auto kept = r->Keep("char", 1);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(static_cast<FakeVersion&>(**kept).version, 1);
  EXPECT_EQ(loads_, loads);  // the same weights, not loaded again
  go_on.Notify();            // the queued release drops one reference, not the last
  absl::Notification drained;
  ASSERT_TRUE(poller.Run([&] { drained.Notify(); }));
  drained.WaitForNotification();
  EXPECT_FALSE(freed.HasBeenNotified());
  kept->reset();
  freed.WaitForNotification();
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kUnloaded);
}

TEST_F(ModelRepositoryTest, StoppingAPollerDoesNotWaitOutItsInterval) {
  Put("char", 1);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  RepositoryPoller poller(r.get(), RepositoryPollerConfig{absl::Hours(1)});
  poller.Stop();  // would hang the test for an hour
  EXPECT_EQ(poller.polls(), 0);
}

TEST_F(ModelRepositoryTest, KeepLoadsAVersionThePolicyPassedOverForItsSessionsOnly) {
  Put("char", 1);
  Put("char", 2);
  auto r = Open();  // latest: version 2 alone
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(loads_, 1);
  auto kept = r->Keep("char", 1);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(static_cast<FakeVersion&>(**kept).version, 1);
  EXPECT_EQ(loads_, 2);
  // Held for its sessions, never for new requests; a second Keep shares it.
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kRetiring);
  EXPECT_FALSE(r->Find("char", 1).ok());
  EXPECT_EQ(Newest(*r, "char"), 2);
  auto again = r->Keep("char", 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), kept->get());
  EXPECT_EQ(loads_, 2);
  // A ready version is itself; a poll leaves the kept one alone.
  EXPECT_EQ(static_cast<FakeVersion&>(**r->Keep("char", 2)).version, 2);
  ASSERT_TRUE(r->Poll().ok());
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kRetiring);
  kept->reset();
  again->reset();
  EXPECT_EQ(StateOf(*r, "char", 1), VersionState::kUnloaded);
  // A version whose file is gone, or damaged, cannot be kept.
  auto gone = r->Keep("char", 5);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("version 5"));
  Put("char", 3, "bad");
  EXPECT_THAT(r->Keep("char", 3).status().message(), HasSubstr("damaged checkpoint"));
}

// Keep (a recovered session's version) holds to the budget like a poll's
// load: refused before loading, with the figures, and kept once it fits.
TEST_F(ModelRepositoryTest, KeepRefusesAVersionOverTheMemoryBudgetBeforeLoadingIt) {
  Put("char", 1);
  Put("char", 2);
  auto created = ModelRepository::Create({dir_, *ParseVersionPolicy("latest"), 1000}, Loader(),
                                         [](const RepositoryVersion&) -> absl::StatusOr<int64_t> { return 600; });
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<ModelRepository> r = *std::move(created);
  ASSERT_EQ(loads_, 1);  // version 2
  auto refused = r->Keep("char", 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("model \"char\" version 1 needs 600 bytes, and --model_memory_budget 1000 has 400 left "
                        "(char version 2 READY 600 held)"));
  EXPECT_EQ(loads_, 1);
  EXPECT_EQ(r->HeldBytes(), 600);
  ASSERT_TRUE(r->SetMemoryBudget(1200).ok());
  auto kept = r->Keep("char", 1);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(loads_, 2);
  EXPECT_EQ(r->HeldBytes(), 1200);
}

TEST_F(ModelRepositoryTest, APollerRunsQueuedWorkWithoutPollingAndFinishesItBeforeStopping) {
  Put("char", 1);
  auto r = Open();
  ASSERT_NE(r, nullptr);
  RepositoryPoller poller(r.get(), RepositoryPollerConfig{absl::InfiniteDuration()});
  absl::Notification loaded;
  Put("char", 2);
  ASSERT_TRUE(poller.Run([&] {
    EXPECT_TRUE(r->Load("char").ok());
    loaded.Notify();
  }));
  loaded.WaitForNotification();
  EXPECT_EQ(Newest(*r, "char"), 2);
  EXPECT_EQ(poller.polls(), 0);  // an infinite interval never polls by itself
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(poller.Run([&] { ++ran; }));
  poller.Stop();
  EXPECT_EQ(ran, 3);
  EXPECT_FALSE(poller.Run([&] { ++ran; }));
}

}  // namespace
}  // namespace txl
