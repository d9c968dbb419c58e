// StateCache: the states that requests without a session reached, kept so
// that a later request repeating their tokens goes on from there instead of
// feeding them again (docs/SESSIONS.md, "The state cache"). A chat client
// that re-sends its whole conversation finds the state at the end of its
// previous reply.
//
// An entry is the engine image of a state and the tokens that led to it,
// under a scope: the principal and everything that makes states differ
// (the model's fingerprint, its number formats, the window). A principal
// never reads another's entries. Keys are a hash chain over the tokens; an
// entry also keeps its last `check` tokens and is used only where they
// match, and a state depends on no more than its last receptive field of
// tokens (docs/SESSIONS.md, "Bounded replay"), so a hit is exact even if two
// histories' hashes collided. One byte budget (--state_cache_budget); past
// it the least recently used entries go. A full cache evicts, never refuses.
//
// Threading: thread-safe; mu_ is a leaf lock.
#ifndef TXL_SERVER_SESSIONS_STATE_CACHE_H_
#define TXL_SERVER_SESSIONS_STATE_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace txl {

struct StateCacheConfig {
  int64_t budget_bytes = 256ll << 20;  // 0: no cache
};

// A state the cache hands back: restore `image`, then feed `pending` and
// the request's tokens after `position`.
struct CachedState {
  int64_t position = 0;                      // tokens it stands for, pending ones included
  std::shared_ptr<const std::string> image;  // SessionState::AppendTo bytes
  std::vector<int> pending;                  // the last of those tokens, not fed yet (at most one)
};

struct StateCacheStats {
  int64_t entries = 0, bytes = 0;
  int64_t hits = 0, store_hits = 0, misses = 0, evictions = 0;
  int64_t tokens_saved = 0;  // tokens hits did not feed
};

// How a request without a session found its state: here, in the state
// store (shared_state_cache.h: kept by another replica), or not at all.
enum class CacheLookup { kHit, kStoreHit, kMiss };

class StateCache {
 public:
  explicit StateCache(const StateCacheConfig& config) : config_(config) {}

  bool enabled() const { return config_.budget_bytes > 0; }
  // Keeps the state that `tokens` led to (tokens.size() == state.position);
  // `check`: how many of the last tokens a hit must match (the receptive field).
  void Put(const std::string& scope, absl::Span<const int> tokens, CachedState state, int64_t check);
  // The longest prefix of `tokens` with a kept state that leaves at least one
  // token to feed (its pending one, or one after it).
  std::optional<CachedState> Longest(const std::string& scope, absl::Span<const int> tokens);
  // One request's lookup, and the tokens a hit saved it (for the metrics).
  void Count(CacheLookup result, int64_t tokens_saved);

  // The hash chain over `scope` and the tokens: chain[i] stands for tokens[0, i).
  static std::vector<uint64_t> Chain(const std::string& scope, absl::Span<const int> tokens);
  // A hit's conditions, for `tokens` against a state kept for tokens[0, length)
  // with these last `check` tokens and `pending` count.
  static bool Usable(absl::Span<const int> tokens, int64_t length, absl::Span<const int> check, size_t pending);

  StateCacheStats stats() const;
  const StateCacheConfig& config() const { return config_; }

 private:
  // The hash chain over the scope and a prefix's tokens, and its length.
  using Key = std::pair<uint64_t, int64_t>;
  struct Entry {
    Key key;
    std::string scope;
    CachedState state;
    std::vector<int> check;  // the last tokens it stands for
    int64_t bytes() const;
  };
  using Order = std::list<Entry>;  // least recently used first
  void Remove(Order::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StateCacheConfig config_;
  mutable absl::Mutex mu_;
  Order order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Key, Order::iterator> index_ ABSL_GUARDED_BY(mu_);
  StateCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_SERVER_SESSIONS_STATE_CACHE_H_
