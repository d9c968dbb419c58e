// The directory state backend: keys are files under the root, temp files a
// crash or another replica left, opening beside other writers, fsync policies
// and the interval syncer.
#include "server/durability/state_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/server/durability/state_backend_fixture.h"

namespace txl {
namespace {

namespace fs = std::filesystem;
using testing::Append;
using testing::TempDir;

std::unique_ptr<StateBackend> OpenDir(const std::string& root, FsyncPolicy fsync = FsyncPolicy::kAlways,
                                      absl::Duration interval = absl::Seconds(1), const std::string& writer = "") {
  StateBackendConfig config;
  config.writer = writer;
  config.spec = absl::StrCat("dir:", root);
  config.fsync = fsync;
  config.fsync_interval = interval;
  auto backend = OpenStateBackend(config);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(DirectoryStateBackendTest, KeysAreFilesUnderTheRoot) {
  TempDir dir;
  auto backend = OpenDir(dir.path());
  ASSERT_TRUE(backend->Put("sessions/s1/meta", "meta bytes").ok());
  ASSERT_TRUE(Append(backend.get(), {{"sessions/s1/log", "r1"}, {"sessions/s1/log", "r2"}}).ok());
  EXPECT_EQ(ReadFile(absl::StrCat(dir.path(), "/sessions/s1/meta")), "meta bytes");
  EXPECT_EQ(ReadFile(absl::StrCat(dir.path(), "/sessions/s1/log")), "r1r2");
  // Deleting a session's last key removes its directory too.
  ASSERT_TRUE(backend->Delete("sessions/s1/meta").ok());
  ASSERT_TRUE(backend->Delete("sessions/s1/log").ok());
  EXPECT_FALSE(fs::exists(absl::StrCat(dir.path(), "/sessions")));
  EXPECT_TRUE(fs::exists(absl::StrCat(dir.path(), "/.lock")));
}

TEST(DirectoryStateBackendTest, AKeyUnderAFileKeyFailsNamingTheKey) {
  TempDir dir;
  auto backend = OpenDir(dir.path());
  ASSERT_TRUE(backend->Put("a", "file").ok());
  absl::Status put = backend->Put("a/b", "v");
  EXPECT_FALSE(put.ok());
  EXPECT_TRUE(absl::StrContains(put.message(), "\"a/b\"")) << put;
  EXPECT_TRUE(absl::StrContains(put.message(), "Not a directory")) << put;  // strerror
  EXPECT_FALSE(Append(backend.get(), {{"a/c", "v"}}).ok());
  EXPECT_EQ(*backend->Get("a"), "file");
}

TEST(DirectoryStateBackendTest, TempFilesACrashLeftAreIgnoredThenRemovedOnReopen) {
  TempDir dir;
  auto backend = OpenDir(dir.path(), FsyncPolicy::kAlways, absl::Seconds(1), "r1");
  ASSERT_TRUE(backend->Put("sessions/s1/snap", "complete").ok());
  ASSERT_TRUE(backend->Put("x.tmp.y", "a key that only looks like a temp file").ok());
  // What a Put of this writer killed between write and rename leaves: a temp file beside the key.
  const std::string stale1 = absl::StrCat(dir.path(), "/sessions/s1/.snap.tmp.r1.4242.7");
  const std::string stale2 = absl::StrCat(dir.path(), "/.top.tmp.r1.1.0");
  std::ofstream(stale1) << "torn";
  std::ofstream(stale2) << "torn";
  EXPECT_EQ(*backend->List(""), (std::vector<std::string>{"sessions/s1/snap", "x.tmp.y"}));
  backend.reset();

  backend = OpenDir(dir.path(), FsyncPolicy::kAlways, absl::Seconds(1), "r1");
  EXPECT_FALSE(fs::exists(stale1));
  EXPECT_FALSE(fs::exists(stale2));
  EXPECT_EQ(*backend->Get("sessions/s1/snap"), "complete");
  EXPECT_EQ(*backend->Get("x.tmp.y"), "a key that only looks like a temp file");
  // And a Put leaves no temp file of its own.
  ASSERT_TRUE(backend->Put("sessions/s1/snap", "newer").ok());
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 3);  // snap, x.tmp.y, .lock
}

// Regression: a replica opening a shared directory removed every temp file,
// including another live replica's Put in flight, whose rename then failed.
TEST(DirectoryStateBackendTest, OpeningLeavesOtherWritersTempFilesUnlessOld) {
  TempDir dir;
  auto a = OpenDir(dir.path(), FsyncPolicy::kNever, absl::Seconds(1), "a");
  ASSERT_TRUE(a->Put("sessions/s1/snap", "x").ok());
  const std::string in_flight = absl::StrCat(dir.path(), "/sessions/s1/.snap.tmp.a.77.3");
  const std::string abandoned = absl::StrCat(dir.path(), "/sessions/s1/.log.tmp.c.78.0");
  std::ofstream(in_flight) << "being written by a";
  std::ofstream(abandoned) << "left by c two hours ago";
  const auto two_hours_ago = fs::file_time_type::clock::now() - std::chrono::hours(2);
  fs::last_write_time(abandoned, two_hours_ago);
  auto b = OpenDir(dir.path(), FsyncPolicy::kNever, absl::Seconds(1), "b");
  EXPECT_TRUE(fs::exists(in_flight)) << "a's write in flight was removed by b opening the directory";
  EXPECT_FALSE(fs::exists(abandoned));
}

// Regression: opening the store failed ("state directory: open ...: No such
// file or directory") when another replica removed an emptied session
// directory while the opening one looked for its stale temp files.
TEST(DirectoryStateBackendTest, OpeningWhileAnotherWriterRemovesDirectoriesWorks) {
  TempDir dir;
  auto churn = OpenDir(dir.path(), FsyncPolicy::kNever, absl::Seconds(1), "a");
  constexpr int kSessions = 400;  // each open walks them all: a wide window for the race
  for (int i = 0; i < kSessions; ++i) ASSERT_TRUE(churn->Put(absl::StrCat("sessions/s", i, "/meta"), "m").ok());
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop.load(); ++i) {
      const std::string key = absl::StrCat("sessions/s", i % kSessions, "/meta");
      ASSERT_TRUE(churn->Delete(key).ok());  // removes the emptied directory
      ASSERT_TRUE(churn->Put(key, "m").ok());
    }
  });
  int failures = 0;
  std::string first;
  for (int n = 0; n < 300; ++n) {
    StateBackendConfig config;
    config.spec = absl::StrCat("dir:", dir.path());
    config.fsync = FsyncPolicy::kNever;
    config.writer = "b";
    auto b = OpenStateBackend(config);
    if (!b.ok() && failures++ == 0) first = std::string(b.status().message());
  }
  stop.store(true);
  writer.join();
  EXPECT_EQ(failures, 0) << first;
}

TEST(DirectoryStateBackendTest, EveryFsyncPolicyRoundTrips) {
  for (FsyncPolicy policy : {FsyncPolicy::kAlways, FsyncPolicy::kInterval, FsyncPolicy::kNever}) {
    SCOPED_TRACE(static_cast<int>(policy));
    TempDir dir;
    {
      auto backend = OpenDir(dir.path(), policy, absl::Milliseconds(10));
      ASSERT_TRUE(backend->Put("s/1/snap", "snap").ok());
      ASSERT_TRUE(Append(backend.get(), {{"s/1/log", "a"}, {"s/2/log", "b"}}).ok());
      ASSERT_TRUE(Append(backend.get(), {{"s/1/log", "c"}}).ok());
      EXPECT_TRUE(*backend->CompareAndSet("s/1/holder", std::nullopt, "me"));
      ASSERT_TRUE(backend->Put("s/2/bad", "bad").ok());
      ASSERT_TRUE(backend->Quarantine("s/2/bad").ok());
      ASSERT_TRUE(backend->Delete("s/2/log").ok());
      absl::SleepFor(absl::Milliseconds(30));  // let an interval sync run over these
    }
    auto backend = OpenDir(dir.path(), FsyncPolicy::kNever);
    EXPECT_EQ(*backend->Get("s/1/snap"), "snap");
    EXPECT_EQ(*backend->Get("s/1/log"), "ac");
    EXPECT_EQ(*backend->Get("s/1/holder"), "me");
    EXPECT_EQ(*backend->List(""), (std::vector<std::string>{"s/1/holder", "s/1/log", "s/1/snap"}));
    EXPECT_EQ(backend->List("quarantine/")->size(), 1u);
  }
}

TEST(DirectoryStateBackendTest, IntervalSyncerStopsPromptly) {
  TempDir dir;
  // An hour between syncs: the destructor must wake the syncer, not wait it out.
  auto backend = OpenDir(dir.path(), FsyncPolicy::kInterval, absl::Hours(1));
  ASSERT_TRUE(backend->Put("k", "v").ok());
  ASSERT_TRUE(Append(backend.get(), {{"log", "x"}}).ok());
  const absl::Time start = absl::Now();
  backend.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // Busy syncing every millisecond while writers run, then stopped.
  backend = OpenDir(dir.path(), FsyncPolicy::kInterval, absl::Milliseconds(1));
  std::vector<std::thread> writers;
  for (int i = 0; i < 4; ++i) {
    writers.emplace_back([&backend, i] {
      for (int n = 0; n < 50; ++n) ASSERT_TRUE(Append(backend.get(), {{absl::StrCat("w/", i), "x"}}).ok());
    });
  }
  for (auto& t : writers) t.join();
  backend.reset();
  backend = OpenDir(dir.path(), FsyncPolicy::kNever);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(*backend->Get(absl::StrCat("w/", i)), std::string(50, 'x'));
}

TEST(DirectoryStateBackendTest, IntervalMustBePositive) {
  TempDir dir;
  StateBackendConfig config;
  config.spec = dir.path();
  config.fsync = FsyncPolicy::kInterval;
  config.fsync_interval = absl::ZeroDuration();
  EXPECT_EQ(OpenStateBackend(config).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace txl
