// Scheduler: the engine thread and its admission queue (docs/DESIGN.md, "The
// scheduler: one engine thread, continuous batching").
// It owns every running request's session lease and advances the jobs
// together: each loop it admits queued jobs up to max_batch, lets each run
// (job.h: one-shot kinds finish there), runs one batched step for the
// feeding kinds (batch_step.h), and between steps moves idle sessions out
// of memory and hands sessions over (offload.h).
//
// With a journal (SetJournal), every history token a job commits is logged
// before the client hears of it, and a job that logs keeps its session busy
// until the journal has written it; if the state store failed, the session rolls
// back to what the store holds (docs/ROBUSTNESS.md, "When the state store fails").
//
// Threading: Submit*/Cancel/Pause/Resume/Drain may be called from any thread
// and never block on the engine; mu_ guards the queue and nothing else.
// Callbacks run on the engine thread (or, with a journal, on its writer
// thread) and must not block. Only the engine thread touches the engine and
// session states.
#ifndef TXL_SERVER_BATCHING_SCHEDULER_H_
#define TXL_SERVER_BATCHING_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/batching/batch_step.h"
#include "server/batching/offload.h"
#include "server/durability/session_journal.h"
#include "server/engine/engine.h"
#include "server/jobs/branch_job.h"
#include "server/jobs/generate_spec.h"
#include "server/jobs/job.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/scheduler_config.h"
#include "server/jobs/session_jobs.h"
#include "server/sessions/session_table.h"

namespace txl {

class Scheduler {
 public:
  // table must outlive the scheduler; observer may be null. Each session
  // runs on its own model version's engine (SessionLease::model).
  Scheduler(const SchedulerConfig& config, SessionTable* table, SchedulerObserver* observer);
  ~Scheduler();  // Stop()s

  // Makes every acknowledgement wait for the journal (before Start; may be null).
  void SetJournal(SessionJournal* journal);
  // The state cache's shared tier (shared_state_cache.h); before Start.
  void SetSharedStateCache(SharedStateCache* shared) { runner_.set_shared_cache(shared); }
  void Start();
  // Refuses new jobs (UNAVAILABLE); running ones go on.
  void Drain();
  bool draining() const;
  // Cancels what is left and joins the engine thread.
  void Stop();

  // Each takes the lease: on acceptance the scheduler gives it back (or, for
  // a throw-away session, discards it) when the job ends; on refusal it is
  // given back unchanged before the call returns. Refusals: RESOURCE_EXHAUSTED
  // (queue full), UNAVAILABLE (draining, or a journaled change the state
  // state store cannot take). The requests were validated (request_validation.h).
  absl::StatusOr<std::shared_ptr<Job>> SubmitGenerate(SessionLease lease, GenerateSpec spec,
                                                      GenerateCallbacks callbacks);
  absl::StatusOr<std::shared_ptr<Job>> SubmitScore(SessionLease lease, std::vector<int> input, bool commit,
                                                   ScoreDone done);
  // A throw-away session's prompt, fed once and copied `copies` times
  // (BranchJob): `done` gets the sessions, each then the caller's to submit
  // or give back.
  absl::StatusOr<std::shared_ptr<Job>> SubmitBranch(SessionLease lease, std::vector<int> input, int copies,
                                                    BranchDone done);
  // One choice of a call whose prompt BranchJob fed: part of a request
  // already admitted, so neither draining nor --max_queue refuses it (the
  // call was counted once, when it was queued). A throw-away session only.
  std::shared_ptr<Job> SubmitChoice(SessionLease lease, GenerateSpec spec, GenerateCallbacks callbacks);
  // `position` 0: the source as it is; else as it was there (RewindJob's rules).
  absl::StatusOr<std::shared_ptr<Job>> SubmitFork(SessionLease source, absl::Duration idle_ttl,
                                                  std::map<std::string, std::string> labels, int64_t position,
                                                  SessionMade done);
  absl::StatusOr<std::shared_ptr<Job>> SubmitRewind(SessionLease lease, int64_t position, JobDone done);
  // The session rebuilt on version `to` (MigrateJob's rules).
  absl::StatusOr<std::shared_ptr<Job>> SubmitMigrate(SessionLease lease, std::shared_ptr<ServedModel> to, JobDone done);
  absl::StatusOr<std::shared_ptr<Job>> SubmitExport(SessionLease lease, ExportDone done);
  using ImportSpec = txl::ImportSpec;
  absl::StatusOr<std::shared_ptr<Job>> SubmitImport(ImportSpec spec, SessionMade done);
  // NOT_FOUND (none, or another principal's), UNAVAILABLE (a live replica
  // serves it), DATA_LOSS (damaged; quarantined). Needs a journal.
  // The session comes back on the version `model_of` gives its record.
  absl::StatusOr<std::shared_ptr<Job>> SubmitAdopt(std::string caller, std::string id, RecordModel model_of,
                                                   JobDone done);
  // After Stop(), on the caller's thread (the only one left): Offloader::SnapshotAll.
  absl::Status SnapshotAll() { return offloader_.SnapshotAll(); }
  // The job leaves the batch at the next step and ends with Finish::kCancelled.
  void Cancel(const std::shared_ptr<Job>& job);
  // Flow control for a client that reads slower than the job produces: a
  // paused job is left out of the batch (others go on) until Resume, or is
  // cancelled with StalledError after stall_timeout.
  void Pause(const std::shared_ptr<Job>& job);
  void Resume(const std::shared_ptr<Job>& job);

  int64_t queue_depth() const;
  int64_t active() const { return runner_.active.load(); }

 private:
  // `admitted`: part of a request already queued once (SubmitChoice): no
  // draining or max_queue refusal.
  absl::StatusOr<std::shared_ptr<Job>> Enqueue(std::shared_ptr<Job> job, bool admitted = false);
  // Refuses a change to a journaled session the state store cannot take, giving the lease back.
  absl::StatusOr<std::shared_ptr<Job>> EnqueueWritable(std::shared_ptr<Job> job);
  void Loop();
  // Waits for work and moves queued jobs into `active`; false once stopping with nothing left.
  bool Admit(std::vector<std::shared_ptr<Job>>& active);
  void Tick();  // about once a second: expiry, hand-over, offload
  void TakeFromQueue(std::shared_ptr<Job> job, std::vector<std::shared_ptr<Job>>& active)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobRunner runner_;     // engine thread
  BatchStep batch_;      // engine thread
  Offloader offloader_;  // engine thread (Want: any)

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t resumed_ ABSL_GUARDED_BY(mu_) = 0;  // Resume/Cancel calls: wakes a loop whose jobs are all paused
  std::thread thread_;
};

}  // namespace txl

#endif  // TXL_SERVER_BATCHING_SCHEDULER_H_
