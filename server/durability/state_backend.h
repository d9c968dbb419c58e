// StateBackend: where durable session state lives (--state_dir, or
// --state_store=redis://...). A flat key -> bytes store with the few
// operations the session journal needs; it knows nothing about sessions.
//
// Keys are printable ASCII of [A-Za-z0-9._/-], slash-separated, never
// starting with "/" or containing "..": the directory backend maps them to
// paths under its root, the Redis backend prefixes them.
//
// Durability (--fsync, directory backend): every method returns after the
// bytes are written to the OS, so a process crash (SIGKILL) loses nothing
// that a call returned for. kAlways also fsyncs the files (and the directory
// on rename) before returning, so a machine crash loses nothing either;
// kInterval fsyncs the files written since the last sync every interval (a
// machine crash loses at most that interval); kNever leaves it to the OS. The
// Redis backend's durability is the Redis server's own (appendonly,
// appendfsync); the policy does not change it.
//
// Threading: every method is thread-safe.
#ifndef TXL_SERVER_DURABILITY_STATE_BACKEND_H_
#define TXL_SERVER_DURABILITY_STATE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace txl {

enum class FsyncPolicy { kAlways, kInterval, kNever };
// "always", "interval", "never"; INVALID_ARGUMENT otherwise.
absl::StatusOr<FsyncPolicy> ParseFsyncPolicy(absl::string_view name);

// What a guarded write (StateBackend::Write) checks, atomically with it.
struct StoreGuard {
  enum Kind { kOneOf, kAbsent, kLength } kind = kOneOf;
  std::string key;
  std::vector<std::string> values;  // kOneOf: the key's value is one of these
  int64_t length = 0;               // kLength: the value's length in bytes (an absent key has 0)
};

// What a guarded write changes.
struct StoreMutation {
  enum Kind { kPut, kAppend, kDelete } kind = kPut;
  std::string key;
  std::string value;  // kPut, kAppend
};

// A write that changes nothing unless every guard holds.
struct StoreWrite {
  std::string label;  // what it is ("append", "rewind", ...): for logs, and the store's own monitoring
  std::vector<StoreGuard> guards;
  std::vector<StoreMutation> mutations;
};

// A StoreWrite's outcome (StateBackend::Write): applied, or the index (>= 0)
// of the guard that failed (nothing of it written), or one of these.
inline constexpr int kWriteApplied = -1;
inline constexpr int kWriteNotApplied = -2;  // the call failed at or before it: nothing of it written
inline constexpr int kWriteUnknown = -3;     // it may have been applied, in part or whole, or may be later

struct StateBackendConfig {
  // "DIR" or "dir:DIR" (a directory, created if missing), or
  // "redis://HOST:PORT[/PREFIX]" (keys are stored as PREFIX + ":" + key;
  // default prefix "txl").
  std::string spec;
  FsyncPolicy fsync = FsyncPolicy::kInterval;
  absl::Duration fsync_interval = absl::Seconds(1);
  absl::Duration redis_timeout = absl::Seconds(2);  // connect and per-command
  // Directory store: who writes (the replica name). Its temporary files carry
  // it, and opening the store removes only the ones a crash of this writer
  // left (and any older than an hour): another live replica's writes in
  // flight in a shared directory are not touched.
  std::string writer;
};

class StateBackend {
 public:
  virtual ~StateBackend() = default;

  // "dir:/abs/path" or "redis://host:port/prefix", for logs and errors.
  virtual std::string Describe() const = 0;

  // Replaces the key's value atomically: a reader (also after a crash at any
  // point) sees the whole old value or the whole new one.
  virtual absl::Status Put(const std::string& key, absl::string_view value) = 0;

  // NOT_FOUND when the key is absent.
  virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;

  // Absent keys are fine.
  virtual absl::Status Delete(const std::string& key) = 0;

  // Every key that starts with `prefix`, sorted.
  virtual absl::StatusOr<std::vector<std::string>> List(const std::string& prefix) = 0;

  // Sets the key to `value` if its current value is `expected` (nullopt: the
  // key is absent), atomically with respect to every other process using
  // the same backend. Returns whether it was set. Used for session claims.
  virtual absl::StatusOr<bool> CompareAndSet(const std::string& key, const std::optional<std::string>& expected,
                                             absl::string_view value) = 0;

  // Applies each write whose guards all hold, atomically with respect to
  // every other process using the same backend (in Redis a write is applied
  // whole or not at all; the directory backend applies a write's mutations
  // in order, so a crash may leave a prefix of them). One call is one group
  // commit. `outcomes` gets one entry per write (see kWriteApplied). OK when
  // every write has an outcome that is not kWriteNotApplied or
  // kWriteUnknown; else the error: UNKNOWN when some write's outcome is
  // unknown (a reply lost or timed out after the writes were sent, a failure
  // after a write took effect), which the caller must read back.
  virtual absl::Status Write(const std::vector<StoreWrite>& writes, std::vector<int>* outcomes) = 0;

  // Whether a write whose call failed may still be applied later: a store
  // across a network (Redis) that received it. The directory store's writes
  // are done or not when the call returns.
  virtual bool AppliesLate() const = 0;

  // Moves the key out of the way to "quarantine/<key>.<unix-seconds>", so
  // that a damaged value is kept for a person to look at and never read
  // again as live state.
  virtual absl::Status Quarantine(const std::string& key) = 0;
};

// INVALID_ARGUMENT for a bad spec; UNAVAILABLE when the directory cannot be
// created or Redis cannot be reached (the message names which).
absl::StatusOr<std::unique_ptr<StateBackend>> OpenStateBackend(const StateBackendConfig& config);

// Whether `key` is a valid key (see above).
bool IsValidStateKey(absl::string_view key);

}  // namespace txl

#endif  // TXL_SERVER_DURABILITY_STATE_BACKEND_H_
