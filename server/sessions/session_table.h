// SessionTable: every live session, its metadata and its model state.
//
// A request takes a session out with Acquire (the session is then busy and
// its state belongs to the request) and gives it back with Release. A second
// Acquire of a busy session fails with ABORTED and changes nothing.
//
// History bookkeeping: position = tokens fed into the memory + pending
// tokens. The last generated token stays pending (unfed) until the next
// request on the session feeds it, so a generation never runs a step whose
// output nobody needs.
//
// Ownership: every session belongs to the principal that created it
// (docs/API_LAYER.md, "Principals"; "" is the anonymous principal of a server without
// --auth_tokens). Every lookup takes the caller's principal, and a session of
// another principal answers exactly like an id that does not exist
// (NOT_FOUND, same message), so no caller can learn that it exists.
//
// Tiers (offload, durability): a session's state is in device memory (an
// SessionState), in host memory (an IdleSession image), or only in the
// state store's journal. Acquire hands out whatever there is; the scheduler
// brings the state back on the engine thread before the request runs.
//
// Threading: all methods are thread-safe; the table never blocks on anything
// but its own mutex, and never touches tensors (states are moved, not copied).
#ifndef TXL_SERVER_SESSIONS_SESSION_TABLE_H_
#define TXL_SERVER_SESSIONS_SESSION_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/engine/served_model.h"
#include "server/sessions/checkpoint_store.h"
#include "server/sessions/key_counts.h"
#include "server/sessions/state_cache.h"
#include "server/sessions/token_history.h"

namespace txl {

struct SessionInfo {
  std::string id;
  std::string owner;  // the principal that created it
  int64_t position = 0;
  int64_t mem_len = 0;
  int64_t memory_tokens = 0;
  int64_t memory_bytes = 0;
  absl::Time created, last_used;
  absl::Duration idle_ttl;
  std::map<std::string, std::string> labels;
  bool busy = false;
  std::string model;  // NAME@VERSION of the version that made its memory
};

// A session out of device memory (offloaded, or read back from the state
// store): the engine image (empty: a fresh session of mem_len) and history
// tokens to feed into it before it is current. The engine thread turns it
// back into a state (Scheduler, on the session's next request).
struct IdleSession {
  std::string state;  // an engine image; empty: an empty state at `start`
  int64_t mem_len = 0;
  int64_t start = 0;  // the state's position, where `feed` begins
  std::vector<int> feed;
  int64_t bytes() const { return static_cast<int64_t>(state.size() + feed.size() * sizeof(int)); }
};

// A session checked out by one request.
struct SessionLease {
  std::string id;
  std::string owner;  // a fork of this lease's session gets the same owner
  // The model version that made its memory, for as long as it lives: its
  // engine runs it, its tokenizer reads it (a session never changes version).
  std::shared_ptr<ServedModel> model;
  // Null while the session is out of device memory: then `idle` holds it,
  // or, if that is null too, only the state store (the journal) does.
  std::unique_ptr<SessionState> state;
  std::shared_ptr<const IdleSession> idle;
  std::vector<int> pending;    // history tokens not yet fed (at most one)
  int64_t known_position = 0;  // the history length, whatever the tier
  bool durable = false;        // journaled in the state store
  // Only this request uses it (no session named, or one the journal lost):
  // never journaled, dropped when given back (SessionTable::GiveBack).
  bool throwaway = false;
  int64_t since_snapshot = 0;  // tokens logged since its last snapshot
  TokenHistory history;        // its last tokens (rewind, fork at a position)
  int64_t position() const { return state ? state->position() + static_cast<int64_t>(pending.size()) : known_position; }
  // Forgets the history past `durable` (what the state store holds): no
  // state, no host image, no pending token, so the next request rebuilds the
  // session from the store.
  void RollBack(int64_t durable);
};

struct SessionTableConfig {
  int64_t max_sessions = 1000;
  absl::Duration default_ttl = absl::Minutes(10);
  absl::Duration max_ttl = absl::Hours(24);
  // Bytes of session memory the table may commit to; 0: no limit. Each
  // session reserves its full-window size (SessionState::full_memory_bytes)
  // when created, so a session admitted never runs out of room later.
  int64_t memory_budget_bytes = 0;
  // Sessions one principal may hold (throw-away and stream sessions
  // included); 0: no limit beyond max_sessions.
  int64_t max_sessions_per_principal = 0;
  // Offload (--host_memory_budget > 0): the memory budget no longer refuses
  // sessions; idle ones leave device memory instead, least recently used
  // first, for host memory (IdleSession, up to this many bytes) and then,
  // with a state store, for the store alone.
  int64_t host_memory_budget_bytes = 0;
  bool has_state_store = false;
  // History tokens each session keeps in memory for rewinds (--session_history_tokens);
  // 0: all of them.
  int64_t history_tokens = 1 << 16;
  CheckpointStoreConfig checkpoints;  // --checkpoint_budget
  StateCacheConfig state_cache;       // --state_cache_budget
};

class SessionTable {
 public:
  explicit SessionTable(const SessionTableConfig& config)
      : config_(config), checkpoints_(config.checkpoints), state_cache_(config.state_cache) {}

  // Session ids are 32 lowercase hex characters from the OS entropy source.
  // A proxy routes on their first kRoutePrefixChars (deploy/nginx/nginx.conf),
  // so an id made for a fork keeps its source's prefix (`same_route_as`) and
  // the fork stays reachable on the replica that holds it.
  static constexpr size_t kRoutePrefixChars = 8;
  static std::string NewId(const std::string& same_route_as = "");

  // RESOURCE_EXHAUSTED at max_sessions, at max_sessions_per_principal for
  // `owner`, at `model`'s own max_sessions (its limits.json, counting all its
  // versions' sessions), or past the memory budget; INVALID_ARGUMENT for a ttl outside
  // [0, max_ttl] (0 picks the default). `id`: empty picks a random one; a
  // taken one is ALREADY_EXISTS (the caller validates its form).
  // `model` made `state` (and holds it from then on).
  absl::StatusOr<SessionInfo> Create(const std::string& owner, std::shared_ptr<ServedModel> model,
                                     std::unique_ptr<SessionState> state, absl::Duration idle_ttl,
                                     std::map<std::string, std::string> labels, absl::Time now,
                                     const std::string& id = "");
  // Creates the session already acquired (throw-away sessions, forks, and
  // journaled sessions until their creation is written). `durable`: its
  // history goes to the journal.
  absl::StatusOr<SessionLease> CreateAcquired(const std::string& owner, std::shared_ptr<ServedModel> model,
                                              std::unique_ptr<SessionState> state, absl::Duration idle_ttl,
                                              std::map<std::string, std::string> labels, absl::Time now,
                                              const std::string& id = "", bool durable = false);

  // `caller`: the principal asking. NOT_FOUND for a session of another one.
  absl::StatusOr<SessionInfo> Get(const std::string& caller, const std::string& id) const;
  // The version the session is bound to (NOT_FOUND as Get).
  absl::StatusOr<std::shared_ptr<ServedModel>> ModelOf(const std::string& caller, const std::string& id) const;
  // Live sessions by the model version they are bound to (NAME@VERSION).
  std::map<std::string, int64_t> SessionsByModel() const;
  // The caller's sessions only.
  std::vector<SessionInfo> List(const std::string& caller) const;
  // NOT_FOUND, or ABORTED while a request runs on it.
  absl::Status Delete(const std::string& caller, const std::string& id);

  absl::StatusOr<SessionLease> Acquire(const std::string& caller, const std::string& id, absl::Time now);
  // Returns the state; a session deleted meanwhile cannot be (Delete refuses
  // busy sessions), so this always finds it.
  void Release(SessionLease lease, absl::Time now);
  // Drops an acquired session for good (the end of a throw-away session).
  void Discard(SessionLease lease);
  // The end of a request: a throw-away lease is discarded, any other released.
  void GiveBack(SessionLease lease, absl::Time now);
  // The end of a request whose history past `durable` the state store does
  // not hold: the lease rolls back to it (SessionLease::RollBack), its turn
  // checkpoints past it go, and it is released.
  void GiveBackRolledBack(SessionLease lease, int64_t durable, absl::Time now);

  // Removes sessions idle past their ttl (busy ones are never expired) and
  // returns how many; `durable` gets the ids of the journaled ones.
  int ExpireIdle(absl::Time now, std::vector<std::string>* durable = nullptr);

  // --- Durability and offload (the engine thread drives these). ---
  // Registers a session read back from the state store (restart, adoption),
  // out of device memory. ALREADY_EXISTS if the id is live here.
  absl::Status AddIdle(const std::string& id, const std::string& owner, std::shared_ptr<ServedModel> model,
                       absl::Duration idle_ttl, std::map<std::string, std::string> labels, absl::Time created,
                       std::shared_ptr<const IdleSession> idle, std::vector<int> pending, int64_t position,
                       int64_t since_snapshot, TokenHistory history);
  // Idle sessions in device memory to offload, least recently used first,
  // so that the rest fit memory_budget_bytes (empty unless offloading).
  std::vector<std::string> DeviceOverflow() const;
  // Counts the window of session `id`, acquired out of device memory, as
  // its state is about to be rebuilt there; RESOURCE_EXHAUSTED, naming the
  // budget, when that would pass memory_budget_bytes (then it stays where
  // it is). With offload, Acquire has counted it already: offload makes
  // room. Without, only sessions read back from the state store (a restart,
  // an adoption, a store failure's rollback) come back so.
  absl::Status BringBack(const std::string& id);
  // Idle sessions in host memory to drop to the state store, least recently
  // used first, so that the rest fit the host budget (empty without a state store).
  std::vector<std::string> HostOverflow() const;
  // Takes an idle, device-resident session for a snapshot or a hand-over
  // (busy meanwhile); NOT_FOUND or ABORTED otherwise. With `any_tier`, also
  // one out of device memory.
  absl::StatusOr<SessionLease> TakeForSnapshot(const std::string& id, bool any_tier = false);
  // Offload without making the session busy: a request that acquires it
  // meanwhile gets a lease with no state and finds the image with TakeIdle
  // (on the engine thread, which finishes the offload first). Null when the
  // session is not idle in device memory.
  std::unique_ptr<SessionState> BeginOffload(const std::string& id);
  void FinishOffload(const std::string& id, std::shared_ptr<const IdleSession> idle);
  void AbortOffload(const std::string& id, std::unique_ptr<SessionState> state);
  // The host image of a session (whatever its state), taken out of the table; null if none.
  std::shared_ptr<const IdleSession> TakeIdle(const std::string& id);
  // Drops an idle session's host copy: the state store has it.
  void DropToStateStore(const std::string& id);
  // Ids of all sessions (shutdown snapshots).
  std::vector<std::string> Ids() const;
  // Device-resident bytes (full-window) and host bytes, per tier.
  struct TierCounts {
    int64_t device = 0, host = 0, state_store = 0;  // sessions
    int64_t device_bytes = 0, host_bytes = 0;
  };
  TierCounts tiers() const;

  int64_t size() const;
  int64_t memory_bytes() const;
  int64_t reserved_bytes() const;  // full-window bytes of every session (the budget's measure)
  int64_t busy_count() const;
  const SessionTableConfig& config() const { return config_; }
  // Turn checkpoints; a session's go with it (Delete, Discard, expiry).
  CheckpointStore& checkpoints() { return checkpoints_; }
  const CheckpointStore& checkpoints() const { return checkpoints_; }
  // The states requests without a session reached (state_cache.h).
  StateCache& state_cache() { return state_cache_; }
  const StateCache& state_cache() const { return state_cache_; }

 private:
  struct Entry {
    SessionInfo info;
    std::shared_ptr<ServedModel> model;
    std::unique_ptr<SessionState> state;      // null while busy or offloaded
    std::shared_ptr<const IdleSession> idle;  // the host tier
    std::vector<int> pending;
    int64_t reserved_bytes = 0;
    bool resident = true;  // in device memory, counted (or on its way back: Acquire with offload, else BringBack)
    bool durable = false;
    int64_t since_snapshot = 0;
    TokenHistory history;
  };
  using Map = absl::flat_hash_map<std::string, Entry>;
  // Returns the entry's version, for the caller to let go of after mu_ (and
  // after the session's state): a retiring version's last session frees it.
  std::shared_ptr<ServedModel> Erase(Map::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // sessions_by_model_ of `model`'s name, by `delta` (null: none counted).
  void CountModel(const ServedModel* model, int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<absl::Duration> ResolveTtl(absl::Duration ttl) const;
  static void Refresh(Entry& e);
  // Marks the entry busy and moves its state (whatever the tier) into a lease.
  static SessionLease CheckOut(const std::string& id, Entry& e);
  bool offloading() const { return config_.host_memory_budget_bytes > 0; }
  // The caller's entry, or end() (also for another principal's session).
  Map::iterator FindOwned(const std::string& caller, const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Map::const_iterator FindOwned(const std::string& caller, const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One message for "no such id" and "not yours": they must not differ.
  static absl::Status NotFound(const std::string& id);

  const SessionTableConfig config_;
  CheckpointStore checkpoints_;  // its own lock, taken inside mu_
  StateCache state_cache_;       // its own lock, never with mu_
  mutable absl::Mutex mu_;
  Map sessions_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  KeyCounts sessions_of_ ABSL_GUARDED_BY(mu_);  // per owner
  // Live sessions per model name (its versions together), for ModelLimits::max_sessions.
  KeyCounts sessions_by_model_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_SERVER_SESSIONS_SESSION_TABLE_H_
