// What the session journal's tests share: journals on a directory state store
// in a temporary directory, a store that misbehaves on demand (FlakyBackend),
// the records they write (Meta, Snapshot), damage done to the files behind a
// journal's back (Corrupt), and answers waited for (Durable, Answer).
#ifndef TXL_TESTS_SERVER_DURABILITY_JOURNAL_FIXTURE_H_
#define TXL_TESTS_SERVER_DURABILITY_JOURNAL_FIXTURE_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "server/durability/session_journal.h"
#include "server/durability/state_backend_impl.h"

namespace txl::testing {

inline std::string TempDir(const std::string& name) {
  std::filesystem::path p = std::filesystem::temp_directory_path() / absl::StrCat("txl_journal_", name, "_", getpid());
  std::filesystem::remove_all(p);
  return p.string();
}

// A temporary directory, removed when it goes out of scope: declared before
// the journals that write into it, it outlives their writer threads.
struct ScopedDir {
  explicit ScopedDir(const std::string& name) : path(TempDir(name)) {}
  ~ScopedDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
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
//    connection that does: the heartbeats still get through);
//  - HoldWrites(): guarded writes block (the writer thread waits in one,
//    what is queued behind it waits too) until LetWritesGo().
class FlakyBackend : public StateBackend {
 public:
  explicit FlakyBackend(std::unique_ptr<StateBackend> inner) : inner_(std::move(inner)) {}
  std::atomic<bool> failing{false};
  std::atomic<int> lose_replies{0};
  void HoldWrites() {
    absl::MutexLock lock(&gate_mu_);
    holding_ = true;
  }
  void LetWritesGo() {
    absl::MutexLock lock(&gate_mu_);
    holding_ = false;
  }
  // Waits up to 30 s for a write to block in HoldWrites(); false if none did.
  bool AWriteIsHeld() {
    absl::MutexLock lock(&gate_mu_);
    auto held = [this]() ABSL_SHARED_LOCKS_REQUIRED(gate_mu_) { return held_ > 0; };
    return gate_mu_.AwaitWithTimeout(absl::Condition(&held), absl::Seconds(30));
  }
  void Pause(bool writes_only = false) {
    absl::MutexLock lock(&mu_);
    paused_ = true;
    writes_only_ = writes_only;
  }
  void Resume(bool apply_late) {
    absl::MutexLock lock(&mu_);
    for (const auto& writes : late_) {
      std::vector<int> outcomes;
      if (apply_late) {
        EXPECT_TRUE(inner_->Write(writes, &outcomes).ok());
      }
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
      absl::MutexLock lock(&gate_mu_);
      ++held_;
      auto open = [this]() ABSL_SHARED_LOCKS_REQUIRED(gate_mu_) { return !holding_; };
      gate_mu_.Await(absl::Condition(&open));
      --held_;
    }
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
  absl::Mutex gate_mu_;
  bool holding_ ABSL_GUARDED_BY(gate_mu_) = false;
  int held_ ABSL_GUARDED_BY(gate_mu_) = 0;  // writes blocked by HoldWrites()
};

// A journal on the directory store `dir`; with `flaky`, the store is wrapped
// in a FlakyBackend, and *flaky stays valid while the journal lives.
inline std::unique_ptr<SessionJournal> Open(const std::string& dir, const std::string& replica,
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
inline std::pair<absl::Status, int64_t> Durable(SessionJournal* j, const std::string& id, int64_t position) {
  absl::Notification done;
  std::pair<absl::Status, int64_t> out;
  j->AfterDurable(id, position, [&](absl::Status s, int64_t have) {
    out = {s, have};
    done.Notify();
  });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  return out;
}

// `taker` adopting `id` once it may (its holder's heartbeat grew old: that
// replica's store paused, say), retried for up to 30 s.
inline absl::StatusOr<JournalRecord> TakeOver(SessionJournal* taker, const std::string& id, const std::string& caller) {
  absl::StatusOr<JournalRecord> taken;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  do {
    taken = taker->Adopt(id, caller);
  } while (absl::IsUnavailable(taken.status()) && absl::Now() < deadline);
  return taken;
}

// Whether `j` finds within 30 s that another replica took `id` over.
inline bool FindsItLost(SessionJournal* j, const std::string& id) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!j->Lost(id) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  return j->Lost(id);
}

inline SessionMeta Meta(const std::string& id, const std::string& owner = "alice") {
  return SessionMeta{id, owner, 16, absl::Seconds(60), absl::FromUnixSeconds(1700000000), {{"k", "v"}}};
}

inline std::string Snapshot(int64_t position, std::vector<int> pending, std::string state) {
  SessionExport e;
  e.fingerprint = "fake-256";
  e.position = position;
  e.pending = std::move(pending);
  e.state = std::move(state);
  return EncodeSessionExport(e);
}

inline void Corrupt(const std::filesystem::path& file, size_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x5a));
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

}  // namespace txl::testing

#endif  // TXL_TESTS_SERVER_DURABILITY_JOURNAL_FIXTURE_H_
