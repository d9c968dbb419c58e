// JobRunner: what a job may touch on the engine thread (the session table,
// each session's engine, the journal, the observer) and the steps every kind shares:
// bringing an offloaded session back before the job runs, and finishing it
// (settling the session, logging its history, answering once the journal has
// written what the answer promises). docs/DESIGN.md, "The scheduler".
//
// Threading: engine thread only, except `active`, read by anyone.
#ifndef TXL_SERVER_JOBS_JOB_RUNNER_H_
#define TXL_SERVER_JOBS_JOB_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/durability/session_journal.h"
#include "server/durability/shared_state_cache.h"
#include "server/engine/engine.h"
#include "server/jobs/job.h"
#include "server/jobs/scheduler_config.h"
#include "server/sessions/image_buffers.h"
#include "server/sessions/session_table.h"

namespace txl {

class JobRunner {
 public:
  JobRunner(const SchedulerConfig& config, SessionTable* table, SchedulerObserver* observer);

  void set_journal(SessionJournal* journal) { journal_ = journal; }
  // The state cache's entries in the state store, shared by its replicas (may stay null).
  void set_shared_cache(SharedStateCache* shared) { shared_cache_ = shared; }

  const SchedulerConfig& config() const { return config_; }
  // The engine of the model version that made the lease's session.
  static Engine& EngineOf(const SessionLease& lease) { return *lease.model->engine(); }
  SessionTable* table() const { return table_; }
  SchedulerObserver* observer() const { return observer_; }  // may be null
  SessionJournal* journal() const { return journal_; }       // null: no state store
  // The job's session is journaled: its history goes to the state store.
  bool journaled(const Job& job) const { return journaled_lease(job.lease) && !job.lease.throwaway; }
  bool journaled_lease(const SessionLease& lease) const { return journal_ != nullptr && lease.durable; }

  // Ends a cancelled or stalled job, brings an offloaded session back into
  // device memory; false when the job has finished.
  bool Prepare(Job& job);
  // Settles the session and answers (exactly once per job).
  void Finish(Job& job, absl::Status status);
  // Gives the job's session back (or drops a throw-away one).
  void ReturnLease(Job& job);
  // The session's ExportSession bytes (its state in device memory).
  absl::StatusOr<std::string> ExportImage(const SessionLease& lease) const;
  // Keeps the session's state as a turn checkpoint (SessionTable::checkpoints).
  void Checkpoint(const SessionLease& lease);
  // Whom a rebuilt state is for: the session itself, back into device
  // memory (admission counted its window), or a state beside the session's
  // own (a rewind's, a fork's, a migration's), which admission has not
  // counted: on the generic path its rows are refused past the session
  // pools' budget (StepInput::uncounted), and that request alone fails.
  enum class RebuildFor { kTheSession, kBeside };
  // A state of `engine` from its image (empty: fresh at `idle.start`) with
  // `idle.feed` fed into it. A feed longer than the model's receptive field
  // is cut to its last tokens, fed into an empty state where they begin
  // (bounded replay, docs/SESSIONS.md). `fed`: the tokens it fed.
  absl::StatusOr<std::unique_ptr<SessionState>> Rebuild(Engine& engine, const IdleSession& idle, RebuildFor rebuilt_for,
                                                        int64_t* fed = nullptr);
  // Journals a session made on the engine thread (fork, import), held busy
  // in `lease` meanwhile, from its image; then releases it (or drops it if
  // the state store refused) and gives `done` it.
  void RecordNewSession(const SessionInfo& info, SessionLease lease, std::string snapshot, SessionMade done);
  // Generate's tokens go to `on_tokens` once the journal has them (journaled
  // sessions; a failed write stops the job), or now.
  void SendTokens(Job& job, const TokensCallback& on_tokens, GeneratedTokenEvent event, int64_t position);
  // A throw-away session's state (docs/SESSIONS.md, "The state cache"):
  // FromStateCache restores into `lease` the cache's longest state along
  // `tokens` that holds more than `at_least` of them, and returns how many it
  // holds (the job feeds the rest); KeepInStateCache keeps the lease's state
  // as the one `tokens` led to, the last `pending` of them unfed.
  std::optional<size_t> FromStateCache(SessionLease& lease, absl::Span<const int> tokens, size_t at_least);
  void KeepInStateCache(const SessionLease& lease, absl::Span<const int> tokens, std::vector<int> pending);
  // UNAVAILABLE when a change to a journaled session could not be written:
  // refused before anything changes.
  absl::Status CheckWritable(const SessionLease& lease) const;

  std::atomic<int64_t> active{0};  // jobs taken from the queue, not yet finished

 private:
  absl::Status Materialize(Job& job);
  // The cache's scope for a lease: its principal and what makes states differ
  // (the model, its number formats, the window).
  std::string CacheScope(const SessionLease& lease) const;

  const SchedulerConfig config_;
  SessionTable* const table_;
  SchedulerObserver* const observer_;
  SessionJournal* journal_ = nullptr;
  SharedStateCache* shared_cache_ = nullptr;
  std::unique_ptr<ImageBuffers> image_buffers_;  // null: config_.checkpoint_buffers 0, or no checkpoints
};

double SecondsSince(absl::Time t);

}  // namespace txl

#endif  // TXL_SERVER_JOBS_JOB_RUNNER_H_
