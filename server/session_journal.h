// SessionJournal: the durable record of every session (--state_dir or
// --state_store). A session's state is a pure function of its token history
// (DESIGN section 4), so the journal keeps, per session, a snapshot (an
// exact SessionExport image at some position) and an append-only log of the
// history tokens after it; replaying the log onto the snapshot rebuilds the
// state. Keys on the StateBackend:
//   sessions/<id>/meta    owner, mem_len, ttl, labels, created (immutable)
//   sessions/<id>/snap    SessionExport bytes (an empty state: a fresh session)
//   sessions/<id>/log     records: u32 n, i64 start, u64 Hash64 of those two,
//                         i32 tokens[n], u64 Hash64 of all before it
//   sessions/<id>/holder  the replica that serves it
//   wanted/<holder>/<id>  another replica asks the holder to hand it over
//   replicas/<name>       that replica's heartbeat (unix nanoseconds)
//
// Writes are queued and applied in order by one writer thread, which commits
// everything queued in one group (one Append call); After(fn) runs fn once
// everything queued before it is written, which is when the scheduler may
// acknowledge. A snapshot is written (atomically) before its log is reset,
// and log records carry their start position, so a crash between the two
// only leaves records that replay skips.
//
// Ownership between replicas: a session is served by its holder. A replica
// whose heartbeat is older than holder_timeout (or gone: a clean shutdown
// removes it) is dead, and any replica may claim its sessions
// (CompareAndSet on the holder key, so exactly one does). A replica asked
// for a session a live replica holds leaves a "wanted" key; the holder finds
// it at its next heartbeat and hands the session over (snapshot, release)
// once it is idle, so a session whose route moved (scale-up) follows it.
//
// Threading: all methods are thread-safe. Load, Held and Adopt do blocking
// I/O on the caller's thread; the rest only enqueue.
#ifndef TXL_SERVER_SESSION_JOURNAL_H_
#define TXL_SERVER_SESSION_JOURNAL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/session_export.h"
#include "server/state_backend.h"

namespace txl {

// What a session was created with.
struct SessionMeta {
  std::string id;
  std::string owner;
  int64_t mem_len = 0;
  absl::Duration idle_ttl;
  absl::Time created;
  std::map<std::string, std::string> labels;
};

// A session as the journal rebuilds it: its snapshot plus the history
// tokens logged after it.
struct JournalRecord {
  SessionMeta meta;
  SessionExport image;     // image.state empty: a fresh session of meta.mem_len
  std::vector<int> tail;   // history tokens after image.position
  int64_t position() const { return image.position + static_cast<int64_t>(tail.size()); }
};

std::string EncodeSessionMeta(const SessionMeta& meta);
// DATA_LOSS when truncated or damaged.
absl::StatusOr<SessionMeta> DecodeSessionMeta(const std::string& bytes);
// Applies a session's log bytes to `record`: tokens before its position are
// skipped, a torn last record (cut short by a crash) is ignored; DATA_LOSS
// for any other damage (a checksum that fails, a record that starts past the
// end of the history). `valid_bytes`: the length of the log without its torn
// tail.
absl::Status ReplayJournalLog(const std::string& log, JournalRecord* record, size_t* valid_bytes = nullptr);

struct SessionJournalConfig {
  std::string replica;                          // this replica's name
  absl::Duration holder_timeout = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(2);
};

class SessionJournal {
 public:
  // Writes this replica's heartbeat before returning.
  static absl::StatusOr<std::unique_ptr<SessionJournal>> Create(const SessionJournalConfig& config,
                                                                std::unique_ptr<StateBackend> backend);
  ~SessionJournal();  // writes what is queued, removes the heartbeat, joins

  using Done = std::function<void(absl::Status)>;

  // --- Queued writes, applied in order. ---
  // A new session held by this replica: meta (only if the store has no
  // session of that id: another replica's, or one this replica has not
  // loaded), snapshot (export bytes), an empty log. done(OK), or
  // ALREADY_EXISTS and nothing written, or the store's failure; called on
  // the writer thread once written. Keep the session busy until then, so
  // that nothing is logged for it before it exists.
  void RecordCreate(const SessionMeta& meta, std::string snapshot, Done done);
  void RecordTokens(const std::string& id, int64_t start, std::vector<int> tokens);
  // The session's state at some position; the log restarts empty.
  void RecordSnapshot(const std::string& id, std::string snapshot);
  void RecordDelete(const std::string& id);
  // This replica lets the session go: another may claim it at once.
  void RecordRelease(const std::string& id);
  // fn(first write error since the journal opened, or OK) on the writer
  // thread, after everything queued before it. A failed write is sticky:
  // the promise cannot be kept, so nothing more is acknowledged.
  void After(Done fn);
  // Blocks until everything queued so far is written (shutdown).
  absl::Status Flush();

  // --- Blocking reads. ---
  // DATA_LOSS (and the session's keys quarantined) when its state is damaged;
  // NOT_FOUND when there is no such session.
  absl::StatusOr<JournalRecord> Load(const std::string& id);
  // Sessions held by this replica (its own after a restart).
  absl::StatusOr<std::vector<std::string>> Held();
  // Claims a session of a dead replica for this one and loads it. NOT_FOUND:
  // no such session, or not `caller`'s; UNAVAILABLE: a live replica holds it.
  absl::StatusOr<JournalRecord> Adopt(const std::string& id, const std::string& caller);

  // Called on the writer thread, at heartbeats, with the sessions this
  // replica holds that another replica asked for (see above). Setting
  // another (or null) waits for a call in progress, so the owner of a
  // handler may clear it and then go.
  void SetHandoffHandler(std::function<void(std::vector<std::string>)> handler);

  const std::string& replica() const { return config_.replica; }
  std::string Describe() const { return backend_->Describe(); }
  int64_t quarantined() const;

 private:
  struct Op {
    enum Kind { kPut, kAppend, kDelete, kAfter, kCreate } kind;
    std::string key, value;
    Done done;
    std::string snapshot;  // kCreate (key: the id, value: the meta)
    absl::Status result;   // kCreate: ALREADY_EXISTS when the id is taken
  };
  SessionJournal(const SessionJournalConfig& config, std::unique_ptr<StateBackend> backend);
  void Enqueue(std::vector<Op> ops);
  void WriterLoop();
  absl::Status Apply(std::vector<Op>& batch);
  absl::Status Heartbeat();
  void FindWanted();
  absl::Status QuarantineSession(const std::string& id, const std::string& why);

  const SessionJournalConfig config_;
  const std::unique_ptr<StateBackend> backend_;

  mutable absl::Mutex mu_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t applied_ ABSL_GUARDED_BY(mu_) = 0;   // ops written
  int64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;  // ops queued
  absl::Status error_ ABSL_GUARDED_BY(mu_);    // the first write error
  int64_t quarantined_ ABSL_GUARDED_BY(mu_) = 0;
  // Its own mutex, held while the handler runs (see SetHandoffHandler).
  absl::Mutex handoff_mu_;
  std::function<void(std::vector<std::string>)> handoff_ ABSL_GUARDED_BY(handoff_mu_);
  std::thread writer_;
};

}  // namespace txl

#endif  // TXL_SERVER_SESSION_JOURNAL_H_
