// SessionJournal: the durable record of every session (--state_dir or
// --state_store). A session's state is a pure function of its token history
// (docs/MODEL.md, "The model, and why serving it incrementally is exact"),
// so the journal keeps, per session, a snapshot (an exact SessionExport image
// at some position) and an append-only log of the history tokens after it;
// replaying the log onto the snapshot rebuilds the state. Keys on the
// StateBackend:
//   sessions/<id>/meta    owner, mem_len, ttl, labels, created (immutable)
//   sessions/<id>/snap    SessionExport bytes (an empty state: a fresh session)
//   sessions/<id>/log     records: u32 n, i64 start, u64 Hash64 of those two,
//                         i32 tokens[n], u64 Hash64 of all before it; the
//                         whole history since the session was made (a
//                         snapshot does not reset it, so a rewind can go back
//                         past the snapshot after a restart)
//   sessions/<id>/holder  the replica that serves it
//   wanted/<holder>/<id>  another replica asks the holder to hand it over: "<asker> <the
//                         holder token it saw>" (stale once the session was claimed again)
//   replicas/<name>       that replica's heartbeat (unix nanoseconds)
//
// Writes are queued and applied in order by one writer thread, which commits
// everything queued in one group (one StateBackend::Write call, one guarded
// write per op); After(fn) runs fn once everything queued before it is
// written. Log records carry their start position; replay feeds only the
// tokens past the snapshot's. A rewind to p (RecordRewind) writes a snapshot
// at p if the stored one is later, and replaces the log by its first p
// tokens, in one write (atomic in Redis; in the directory the snapshot goes
// first, and a crash between the two replays the old log onto the new
// snapshot, which is the history before the rewind, exactly).
//
// A session changes only by what its client was told was done
// (docs/ROBUSTNESS.md, "When the state store fails"). The journal knows, per session, how far its
// history is written (the durable position) and never writes a gap: a log
// record that does not start there, or a snapshot of another position, is
// refused unwritten. AfterDurable tells the scheduler whether a session's
// history reached a position, and if not, the position it may roll back to.
// A failed write makes the journal unwritable (Writable() says why) until a
// later write, or the heartbeat, succeeds; meanwhile the server refuses
// requests that would change a journaled session.
//
// Ownership between replicas: a session is served by its holder. The
// holder key holds a fencing token ("<replica>#<nonce>", new at every
// claim), and every write to a session is a guarded StateBackend::Write that
// changes nothing unless the holder key still holds this replica's token and
// the log still has the length the journal expects. So a write that arrives
// late (a store that paused) can never extend a history the journal moved
// past, and a replica that lost a session (it paused past holder_timeout and
// another took over) can never write it. A replica whose heartbeat is older
// than holder_timeout (or gone: a clean shutdown removes it) is dead, and
// any replica may claim its sessions (CompareAndSet on the holder key, so
// exactly one does). A replica asked for a session a live replica holds
// leaves a "wanted" key; the holder finds it at its next heartbeat and hands
// the session over (snapshot, release) once it is idle, so a session whose
// route moved (scale-up) follows it. CheckHold tells the scheduler whether
// this replica still holds a session before it serves one from memory: yes
// while the heartbeats have had no gap; after one, once the writer thread
// has read the holder key again.
//
// Unknown outcomes: a write whose reply was lost (the store paused, timed
// out, or failed after a partial apply) may land later or may have landed.
// Its session is then unresolved: its answers (AfterDurable, the done of a
// create, rewind or delete) wait, and nothing more is written for it, until
// the journal has re-fenced the session (a new token, so nothing sent before
// can land after) and read back what landed. The answers then follow the
// store: a history that landed is acknowledged (late), one that did not is
// refused, and the session goes on from what the store holds. A session
// another replica took over meanwhile is lost here; its waiting answers are
// acknowledged only if the store's history holds exactly their tokens.
//
// Threading: all methods are thread-safe. Load, Held, Recover and Adopt do
// blocking I/O on the caller's thread; the rest only enqueue (or, CheckHold
// and Lost, read what the writer thread learnt).
#ifndef TXL_SERVER_DURABILITY_SESSION_JOURNAL_H_
#define TXL_SERVER_DURABILITY_SESSION_JOURNAL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/durability/state_backend.h"
#include "server/sessions/session_export.h"

namespace txl {

// What a session was created with.
struct SessionMeta {
  std::string id;
  std::string owner;
  int64_t mem_len = 0;
  absl::Duration idle_ttl;
  absl::Time created;
  std::map<std::string, std::string> labels;
  // NAME@VERSION of the model version the session is bound to; empty in
  // records written before versions (their image's fingerprint alone names it).
  // Stored as the label kModelLabel.
  std::string model;
};
// The label key a meta stores its model version under (clients may not use
// the "txl." prefix: RequestValidator::Labels).
inline constexpr char kModelLabel[] = "txl.model";

// A session as the journal rebuilds it: its snapshot plus the history
// tokens logged after it.
struct JournalRecord {
  SessionMeta meta;
  SessionExport image;       // image.state empty: a fresh session of meta.mem_len
  std::vector<int> tail;     // history tokens after image.position
  std::vector<int> earlier;  // logged history tokens before image.position, up to it
  int64_t position() const { return image.position + static_cast<int64_t>(tail.size()); }
  int64_t history_start() const { return image.position - static_cast<int64_t>(earlier.size()); }
};

std::string EncodeSessionMeta(const SessionMeta& meta);
// DATA_LOSS when truncated or damaged.
absl::StatusOr<SessionMeta> DecodeSessionMeta(const std::string& bytes);
// Applies a session's log bytes to `record` (its image set, tail and earlier
// empty): the tokens past image.position go to `tail`, those before it to
// `earlier`; a torn last record (cut short by a crash) is ignored; DATA_LOSS
// for any other damage (a checksum that fails, a record that starts past the
// end of the history). `valid_bytes`: the length of the log without its torn
// tail.
absl::Status ReplayJournalLog(const std::string& log, JournalRecord* record, size_t* valid_bytes = nullptr);
// The log cut to the history's first `position` tokens, as one record (a
// rewind); DATA_LOSS when damaged, OUT_OF_RANGE when it holds fewer.
absl::StatusOr<std::string> TruncateJournalLog(const std::string& log, int64_t position);

struct SessionJournalConfig {
  std::string replica;  // this replica's name
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
  // `history_start`, `history`: the tokens before the snapshot's position
  // that the session's log starts with (a fork keeps its source's history).
  void RecordCreate(const SessionMeta& meta, std::string snapshot, Done done, int64_t history_start = 0,
                    std::vector<int> history = {});
  void RecordTokens(const std::string& id, int64_t start, std::vector<int> tokens);
  // The session's state at its durable position (the log goes on).
  void RecordSnapshot(const std::string& id, std::string snapshot);
  // The session's history now ends at `position` (at most its durable
  // position). `snapshot`: its state there, written only if the stored
  // snapshot is later. done(OK) once written, else the store's error or a
  // refusal, and the stored session is as it was.
  void RecordRewind(const std::string& id, int64_t position, std::string snapshot, Done done);
  // The session, at its durable `position`, now runs on another model
  // version (MigrateSession): `snapshot` (that version's image there)
  // replaces the stored one, and `meta` (naming the version) the stored
  // meta, in one write with the log unchanged. done as RecordRewind's; an
  // unknown outcome is read back from the stored snapshot.
  void RecordMigration(const SessionMeta& meta, int64_t position, std::string snapshot, Done done);
  // This replica lets the session go: another may claim it at once.
  void RecordRelease(const std::string& id);
  // Deletes a session; done(OK) once its meta (the commit point: without
  // it the session is gone) is deleted, else the store's error and the
  // session is still there.
  void RecordDelete(const std::string& id, Done done = nullptr);
  // fn(OK) on the writer thread, after everything queued before it.
  void After(Done fn);
  // fn(OK, position) once everything queued before it is written, if the
  // session's history is written up to `position`; else fn(UNAVAILABLE,
  // the durable position), which is what the session must roll back to.
  void AfterDurable(const std::string& id, int64_t position, std::function<void(absl::Status, int64_t)> fn);
  // OK, or UNAVAILABLE naming the store's last failure: writes fail now.
  absl::Status Writable() const;
  // Blocks until everything queued so far is written; then Writable().
  absl::Status Flush();

  // --- Blocking reads. ---
  // DATA_LOSS (and the session's keys quarantined) when its state is damaged;
  // NOT_FOUND when there is no such session. Sets the durable position.
  absl::StatusOr<JournalRecord> Load(const std::string& id);
  // Sessions held by this replica (its own after a restart).
  absl::StatusOr<std::vector<std::string>> Held();
  // Claims a session Held() listed (a new fencing token, so that an earlier
  // run of this replica can write it no more) and loads it.
  absl::StatusOr<JournalRecord> Recover(const std::string& id);
  // OK when this replica still holds the session (or does not journal it).
  // UNAVAILABLE when another replica holds it now (Lost() is then true), or
  // while the hold is being checked: after a gap in the heartbeats longer
  // than holder_timeout/2 (a pause), the writer thread reads every holder
  // key again at the next heartbeat. Never blocks.
  absl::Status CheckHold(const std::string& id);
  // Whether another replica took the session over from this one.
  bool Lost(const std::string& id) const;
  // Claims a session of a dead replica for this one and loads it. NOT_FOUND:
  // no such session, or not `caller`'s; UNAVAILABLE: a live replica holds it.
  absl::StatusOr<JournalRecord> Adopt(const std::string& id, const std::string& caller);

  // Called on the writer thread, at heartbeats, with the sessions this
  // replica holds that another replica asked for (see above), and with
  // those another replica took over from it (Lost): the scheduler looks at
  // its copies of them (HandoffOf) once idle. Setting another (or null)
  // waits for a call in progress, so the owner of a handler may clear it
  // and then go.
  void SetHandoffHandler(std::function<void(std::vector<std::string>)> handler);
  // What to do now with the copy of a session the handler named, decided
  // when the copy is taken (the engine thread, where sessions are claimed):
  // hand it over (snapshot, release) while another replica still asks for
  // it under this replica's current claim; discard it, writing nothing,
  // while another replica holds it; otherwise keep it: it was claimed
  // again since it was named (the copy is the new claim's), or it waits
  // for room for its version (Wait).
  enum class Handoff { kKeep, kDiscard, kHandOver };
  Handoff HandoffOf(const std::string& id) const;

  const std::string& replica() const { return config_.replica; }
  std::string Describe() const { return backend_->Describe(); }
  int64_t quarantined() const;
  // A session quarantined since start-up that nobody was told of yet:
  // DATA_LOSS once for its owner (`caller`; anyone when its owner is
  // unknown), then OK (it answers NOT_FOUND from then on).
  absl::Status TakeQuarantined(const std::string& id, const std::string& caller);

  // A session recovered at start-up whose model version did not fit the
  // model memory budget (recovery.h): it stays held by this replica, out of
  // the live table, until its version is served here (a poll loaded it, or
  // WaitingReadmitter kept it once there was room), until its idle ttl runs
  // out (counted from the start of the wait), or until its owner deletes
  // it; it is not handed to another replica.
  struct WaitingSession {
    std::string id, owner;
    std::string model;        // NAME@VERSION (SessionMeta::model)
    std::string fingerprint;  // its image's
    std::string why;          // what its owner's requests are told
    absl::Time expires = absl::InfiniteFuture();
    absl::Time retry_at = absl::InfinitePast();  // after a failed adoption (WaitingReadmitter): not before
    int64_t claim = 0;                           // EndWait's: the claim it ended under (Tracked::claim); 0 at start-up
  };
  // Wait does nothing for a session this replica does not track, one
  // another replica took over (Lost), or one claimed again since EndWait
  // (its claim differs: an adoption brought it back meanwhile). A claim
  // (Adopt) ends the session's wait. Waiters leaves out the lost ones.
  void Wait(WaitingSession session);
  // For its owner (`caller`): OK once `served(fingerprint)` (the wait ends:
  // it can be adopted here) or once another replica took it over (Lost: it
  // is asked for there), else FAILED_PRECONDITION with `why`. OK for anyone
  // else and for a session that does not wait.
  absl::Status Waiting(const std::string& id, const std::string& caller,
                       const std::function<bool(const std::string&)>& served);
  // Ends the wait of `caller`'s session `id` and returns it (to Wait again
  // should what follows fail); nullopt when it does not wait, for another,
  // and for one another replica took over (its wait ends too).
  std::optional<WaitingSession> EndWait(const std::string& id, const std::string& caller);
  std::vector<WaitingSession> Waiters() const;
  // Deletes from the store, as an expiry does, the waiting sessions whose
  // ttl ran out by `now` (one another replica took over only stops
  // waiting); returns how many were deleted.
  int ExpireWaiting(absl::Time now);
  bool IsWaiting(const std::string& id) const;
  int64_t waiting() const;

 private:
  struct Op {
    enum Kind { kAfter, kDeleteKey, kAppend, kSnapshot, kRewind, kCreate, kDelete, kRelease } kind;
    std::string session;  // the session it writes, or that AfterDurable asks about
    // kAppend: [start, end) and its tokens; kCreate, kSnapshot, kRewind: end;
    // AfterDurable: the position asked about.
    int64_t start = -1, end = -1;
    std::vector<int> tokens;
    std::string key;        // kDeleteKey
    std::string meta, log;  // kCreate: the meta, the log it starts with; kRewind (a migration): the meta
    std::string snapshot;   // kCreate, kSnapshot, kRewind
    Done done;
    std::function<void(absl::Status, int64_t)> durable_done;  // AfterDurable
    absl::Status result;            // what done gets: ALREADY_EXISTS (id taken), a refusal, the store's error
    bool waits = false;             // its outcome is unknown until its session is resolved
    bool held_back = false;         // not sent: its session was unresolved (sent once it is)
    std::string token;              // kCreate: the holder token it writes
    int64_t claim = -1;             // kRelease: the claim it ends (Tracked::claim)
    size_t log_bytes = 0;           // kRewind: the log's length once cut
    bool replace_snapshot = false;  // kRewind: the snapshot (and `meta`) written whatever its position
  };
  // What the journal knows of a session this replica holds (or held).
  struct Tracked {
    std::string token;               // the holder value of this replica's claim
    int64_t claim = 0;               // which claim: a new one per Claim or create, kept by a re-fence's new token
    std::vector<std::string> maybe;  // claims whose outcome is unknown: the holder may be one of these
    int64_t durable = 0;             // its history written so far
    int64_t snapshot_at = -1;        // its stored snapshot's position (-1: unknown)
    int64_t log_bytes = 0;           // the stored log's length at `durable`
    bool lost = false;               // another replica holds it now
    bool verified = true;            // the hold is known since the last gap in the heartbeats
    bool wanted = false;             // another replica asked for it under this claim (FindWanted)
    bool unresolved = false;         // a write's outcome is unknown (see the header)
    // What the unknown writes were: appends sent, and a create, delete or
    // release that may have landed (a rewind's own waiting op says where to).
    std::vector<std::pair<int64_t, std::vector<int>>> sent;
    bool create = false, remove = false, release = false;
    std::vector<Op> waiting;  // answers that wait for the outcome
  };
  // What an op is written against (Apply): this replica's token, and the
  // stored session as the journal knows it.
  struct WriteBasis {
    std::string token;
    int64_t durable = 0, log_bytes = 0, snapshot_at = -1;
  };

  // --- Construction and queueing (session_journal.cc). ---
  SessionJournal(const SessionJournalConfig& config, std::unique_ptr<StateBackend> backend);
  void Enqueue(std::vector<Op> ops);
  // RecordRelease of one claim: written only while that claim is current.
  void QueueRelease(const std::string& id, int64_t claim);
  std::string NewToken();
  // The session's durable position, or -1 when the journal has not seen it.
  int64_t DurableLocked(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- The writer thread (session_journal_writer.cc). ---
  void WriterLoop();
  absl::Status Apply(std::vector<Op>& batch);
  // Apply's parts. BasisFor: what `op` is written against; false when it is
  // not written (refused, its result set, or held back).
  bool BasisFor(Op& op, WriteBasis* basis);
  // OK when `op` continues the session's history, written up to `have`;
  // else its refusal.
  static absl::Status InStep(const Op& op, int64_t have);
  // A rewind's mutations, added to `w` (*ready) from the stored log it
  // reads; else the op is refused or held back. Returns the read's failure.
  absl::Status AddRewindCut(Op& op, int64_t bytes, int64_t snapshot_at, StoreWrite* w, bool* ready);
  // The store write that makes `op`, guarded by this replica's `token` and
  // the log's length `bytes` (a rewind's mutations: Apply adds them).
  StoreWrite WriteOf(const Op& op, const std::string& token, int64_t bytes) const;
  // Sends `group` (ops of held sessions, their writes built) as one group commit.
  absl::Status Send(std::vector<std::pair<Op*, StoreWrite>>& group);
  void Answer(Op& op) ABSL_LOCKS_EXCLUDED(mu_);
  void SetHealth(const absl::Status& write) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Unknown outcomes (session_journal_resolve.cc). ---
  // Writer thread: re-fences an unresolved session and reads what landed
  // (see the header); UNAVAILABLE while the store does not answer.
  absl::Status Resolve(const std::string& id);
  // Resolve's parts. Refence: *held, whether this replica still holds the
  // session (under *token, new where the store applies writes late).
  absl::Status Refence(const std::string& id, const Tracked& t, std::string* token, bool* held);
  // Answers an op that waited for the outcome, from what the store holds:
  // its history up to `end` (`covered`: up to where it is this replica's).
  void AnswerResolved(const std::string& id, Op& op, bool held, bool gone, int64_t end, int64_t covered);
  void ResolveAll();

  // --- Holds between replicas (session_journal_holds.cc). ---
  absl::Status Heartbeat();
  // Writer thread, after a heartbeat: reads the holder key of each session
  // whose hold is unverified (see CheckHold).
  void VerifyHolds();
  void FindWanted();

  // --- Loading and claiming (session_journal_load.cc). ---
  absl::StatusOr<JournalRecord> Claim(const std::string& id, const std::optional<std::string>& current);
  absl::Status QuarantineSession(const std::string& id, const std::string& why, const std::string& owner = "");

  const SessionJournalConfig config_;
  const std::unique_ptr<StateBackend> backend_;

  mutable absl::Mutex mu_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t applied_ ABSL_GUARDED_BY(mu_) = 0;   // ops written
  int64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;  // ops queued
  absl::Status error_ ABSL_GUARDED_BY(mu_);    // the last write's error; OK once one succeeds
  int64_t quarantined_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t claims_ ABSL_GUARDED_BY(mu_) = 0;  // Tracked::claim's last
  std::map<std::string, Tracked> tracked_ ABSL_GUARDED_BY(mu_);
  absl::Time beat_sent_ ABSL_GUARDED_BY(mu_);                 // when the last heartbeat that was written was sent
  uint64_t nonce_ ABSL_GUARDED_BY(mu_) = 0;                   // NewToken's counter
  std::vector<std::string> newly_lost_ ABSL_GUARDED_BY(mu_);  // for the handoff handler, at the next heartbeat
  // Quarantined sessions not yet reported: id -> owner ("" unknown).
  std::map<std::string, std::string> unreported_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, WaitingSession> waiting_ ABSL_GUARDED_BY(mu_);  // Wait's sessions, by id
  // Its own mutex, held while the handler runs (see SetHandoffHandler).
  absl::Mutex handoff_mu_;
  std::function<void(std::vector<std::string>)> handoff_ ABSL_GUARDED_BY(handoff_mu_);
  std::thread writer_;
};

}  // namespace txl

#endif  // TXL_SERVER_DURABILITY_SESSION_JOURNAL_H_
