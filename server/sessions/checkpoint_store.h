// CheckpointStore: engine images of sessions taken at turn boundaries (the
// end of a Generate or a committing Score), so that going back a turn or two
// restores an image instead of replaying the history (docs/SESSIONS.md,
// "Rewind"). All sessions share one byte budget (--checkpoint_budget); past
// it, and past `per_session` images of one session, the least recently used
// go first. Images are shared, immutable bytes: a fork takes its source's
// images up to the fork point without copying them (each holder counts
// them against the budget).
//
// Threading: thread-safe; mu_ is a leaf lock (SessionTable calls in with
// its own held, never the other way round).
#ifndef TXL_SERVER_SESSIONS_CHECKPOINT_STORE_H_
#define TXL_SERVER_SESSIONS_CHECKPOINT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace txl {

// A session as it was at `position`: its state (fed up to the pending
// tokens) and the pending tokens (docs/SESSIONS.md, "History and position").
struct TurnCheckpoint {
  int64_t position = 0;                      // the session's position (pending tokens included)
  std::shared_ptr<const std::string> image;  // SessionState::AppendTo bytes
  std::vector<int> pending;
};

struct CheckpointStoreConfig {
  int64_t budget_bytes = 256ll << 20;  // 0: no checkpoints
  int64_t per_session = 8;
};

class CheckpointStore {
 public:
  explicit CheckpointStore(const CheckpointStoreConfig& config) : config_(config) {}

  // Whether an image of `bytes` can be kept at all (worth taking).
  bool WouldKeep(int64_t bytes) const { return bytes > 0 && bytes <= config_.budget_bytes; }
  // Keeps `image` as the session's state at `position` (replacing one there).
  void Put(const std::string& id, int64_t position, std::shared_ptr<const std::string> image, std::vector<int> pending);
  // The session's checkpoints, oldest position first.
  std::vector<TurnCheckpoint> Of(const std::string& id) const;
  // Marks one as just used (it goes last in the eviction order).
  void Touch(const std::string& id, int64_t position);
  // Forgets the session's checkpoints past `position` (a rewind: they belong
  // to a history that no longer exists), or all of them.
  void DropAfter(const std::string& id, int64_t position);
  void Drop(const std::string& id);
  // Gives `to` the checkpoints of `from` at or before `position` (a fork).
  void CopyUpTo(const std::string& from, const std::string& to, int64_t position);

  int64_t bytes() const;
  int64_t count() const;
  const CheckpointStoreConfig& config() const { return config_; }

 private:
  struct Held {
    std::shared_ptr<const std::string> image;
    std::vector<int> pending;
    uint64_t used = 0;  // tick of its last use
  };
  using PerSession = std::map<int64_t, Held>;  // by position
  void Add(const std::string& id, int64_t position, Held held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(absl::flat_hash_map<std::string, PerSession>::iterator it, PerSession::iterator at)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CheckpointStoreConfig config_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, PerSession> sessions_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace txl

#endif  // TXL_SERVER_SESSIONS_CHECKPOINT_STORE_H_
