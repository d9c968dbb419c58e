// SharedStateCache: the state cache's entries (server/sessions/state_cache.h)
// in the state store too, so that the replicas sharing a store share them: a
// client without a session whose calls land on several replicas still goes
// on from its previous call's state (docs/SESSIONS.md, "The state cache").
//
// Layout, under the store's "statecache/" keys, per scope (its Hash64, hex):
//   statecache/SCOPE/CHAIN-LENGTH  one entry (EncodeSharedEntry)
//   statecache/SCOPE/index         the scope's newest entries' names, one a line
// Each scope keeps its `per_scope` newest entries; the writer deletes the ones
// that fall off its index. Two replicas writing one scope's index at once may
// drop a line, which costs a hit, never a wrong state: an entry is checked
// against its scope and its last tokens before it is used.
//
// Threading: Offer and Longest from any thread. Entries are written by the
// cache's own thread, in the order offered; a full queue drops the newest
// (a cache never holds anyone up).
#ifndef TXL_SERVER_DURABILITY_SHARED_STATE_CACHE_H_
#define TXL_SERVER_DURABILITY_SHARED_STATE_CACHE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/durability/state_backend.h"
#include "server/sessions/state_cache.h"

namespace txl {

struct SharedStateCacheConfig {
  int64_t per_scope = 16;  // entries a scope keeps in the store
  int64_t max_queue = 64;  // entries waiting to be written
};

// One entry as the store keeps it; DATA_LOSS when the bytes are damaged.
struct SharedEntry {
  std::string scope;
  std::vector<int> check;  // the last tokens it stands for
  CachedState state;
};
std::string EncodeSharedEntry(const SharedEntry& entry);
absl::StatusOr<SharedEntry> DecodeSharedEntry(const std::string& bytes);

class SharedStateCache {
 public:
  SharedStateCache(std::unique_ptr<StateBackend> backend, const SharedStateCacheConfig& config);
  ~SharedStateCache();  // writes nothing more; joins the thread
  SharedStateCache(const SharedStateCache&) = delete;
  SharedStateCache& operator=(const SharedStateCache&) = delete;

  // Queues the state `tokens` led to (as StateCache::Put) for the store.
  void Offer(const std::string& scope, absl::Span<const int> tokens, const CachedState& state, int64_t check);
  // The longest entry any replica keeps for `scope` along `tokens` that a
  // request for them can use (StateCache::Usable). Reads the store: two reads.
  std::optional<CachedState> Longest(const std::string& scope, absl::Span<const int> tokens);
  // Returns once what was offered before is written (or dropped); tests.
  void Flush();

 private:
  struct Offered {
    std::string scope;
    uint64_t chain = 0;
    SharedEntry entry;
  };
  void Run();
  void Write(const Offered& o);

  const SharedStateCacheConfig config_;
  const std::unique_ptr<StateBackend> backend_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // the queue, the written count, stop_
  std::deque<Offered> queue_ ABSL_GUARDED_BY(mu_);
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0, offered_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool warned_ ABSL_GUARDED_BY(mu_) = false;  // a failed write is logged once
  std::thread thread_;
};

}  // namespace txl

#endif  // TXL_SERVER_DURABILITY_SHARED_STATE_CACHE_H_
