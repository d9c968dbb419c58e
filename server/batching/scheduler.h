// Scheduler: the engine thread and its admission queue. It owns every
// running request's session lease and advances them in batches
// (continuous batching, docs/DESIGN.md §7): each step, up to max_batch
// requests move together, decoders by one token, prefills by chunks of up to
// prefill_chunk tokens, all under max_batch_tokens. Decoders go first and
// prefills take turns in arrival order, so a long prefill cannot starve them.
//
// With a journal (SetJournal), every history token a job commits is logged
// before the client hears of it: callbacks that acknowledge run after the
// journal has written what came before (on its writer thread). Between
// steps the engine thread also moves idle sessions out of device and host
// memory per the store's budgets, brings offloaded ones back for their next
// job, and hands sessions over to replicas that asked for them. A job that
// logs history keeps its session busy until the journal has written it; if
// the store failed, the session rolls back to what the store holds
// (docs/ROBUSTNESS.md, "When the state store fails").
//
// Threading: Submit*/Cancel/Pause/Resume/Drain may be called from any thread and never
// block on the engine. Callbacks run on the engine thread (or, with a
// journal, on its writer thread) and must not block.
// Only the engine thread touches the engine and session states.
#ifndef TXL_SERVER_BATCHING_SCHEDULER_H_
#define TXL_SERVER_BATCHING_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/tokenizer.h"
#include "server/engine/engine.h"
#include "server/batching/sampler.h"
#include "server/sessions/session_export.h"
#include "server/durability/session_journal.h"
#include "server/sessions/session_table.h"

namespace txl {

struct SchedulerConfig {
  int max_batch = 32;           // requests per engine step
  int max_batch_tokens = 2048;  // tokens fed per engine step
  int prefill_chunk = 256;      // tokens one request feeds per step while prefilling
  int max_queue = 256;          // waiting requests; past it RESOURCE_EXHAUSTED
  // With a journal: a session's log is folded into a fresh snapshot once
  // this many tokens were logged since the last one (bounds replay time).
  int64_t snapshot_tokens = 4096;
  // A generation paused because its client stopped reading (Pause) is
  // cancelled once paused this long (StalledError).
  absl::Duration stall_timeout = absl::Seconds(30);
};

// The status of a job cancelled because its client read nothing for
// stall_timeout; IsStalled tells it from a client's own cancel.
absl::Status StalledError(absl::Duration waited);
bool IsStalled(const absl::Status& status);

struct GeneratedTokenEvent {
  int id = 0;
  std::string text;  // whole UTF-8 characters only; may be empty
  float logprob = 0;
  std::vector<std::pair<int, float>> top;  // when top_logprobs > 0
};

enum class Finish { kLength, kStopToken, kStopSequence, kCancelled };

struct GenerateSpec {
  std::vector<int> input;  // new tokens only
  int max_new_tokens = 16;
  SamplingConfig sampling;
  std::vector<int> stop_token_ids;
  std::vector<std::string> stop_sequences;
  int top_logprobs = 0;
};

struct ScoredTokenResult {
  int id = 0;
  bool has_logprob = false;  // false: no earlier token in the session
  float logprob = 0;
};

struct JobResult {
  std::string session_id;
  Finish finish = Finish::kLength;
  int64_t position = 0;  // the session's position afterwards
  int64_t input_tokens = 0;
  int64_t generated_tokens = 0;
  double queue_seconds = 0, first_token_seconds = 0, total_seconds = 0;
  std::string trailing_text;  // Generate: text held back until the end (e.g. a partial character)
  std::vector<ScoredTokenResult> scores;  // Score
  SessionInfo forked;                     // Fork, Import: the new session
  std::string exported;                   // Export: EncodeSessionExport's bytes
};

struct JobCallbacks {
  // Generate: tokens as they are produced, with the session position after them.
  std::function<void(std::vector<GeneratedTokenEvent>, int64_t position)> on_tokens;
  // Exactly once per accepted job.
  std::function<void(absl::Status, JobResult)> on_done;
};

// Hooks for metrics; every method is called on the engine thread.
class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;
  virtual void OnStep(int batch_size, int64_t tokens, double seconds) {}
  virtual void OnQueueDepth(int64_t depth) {}
  virtual void OnFirstToken(double seconds_since_submit) {}
  virtual void OnInterTokenGap(double seconds) {}
  virtual void OnTokensFed(int64_t n) {}
  virtual void OnTokensGenerated(int64_t n) {}
  virtual void OnSessionsExpired(int n) {}
  virtual void OnTick() {}  // about once a second
  // A session left device memory ("host") or host memory ("store").
  virtual void OnOffload(const char* to, double seconds) {}
  // A session came back into device memory from "host" or "store".
  virtual void OnRestore(const char* from, double seconds) {}
};

class Job;

class Scheduler {
 public:
  // engine, store and tokenizer must outlive the scheduler; observer may be null.
  Scheduler(const SchedulerConfig& config, Engine* engine, SessionTable* table,
            const Tokenizer* tokenizer, SchedulerObserver* observer);
  ~Scheduler();  // Stop()s

  // Makes every acknowledgement wait for the journal (before Start; may be null).
  void SetJournal(SessionJournal* journal);
  void Start();
  // Refuses new jobs (UNAVAILABLE); running ones go on.
  void Drain();
  bool draining() const;
  // Cancels what is left and joins the engine thread.
  void Stop();

  // Each takes the lease: on acceptance the scheduler gives it back (or, for
  // a throw-away session, discards it) when the job ends; on rejection it is
  // given back before the call returns. Errors: RESOURCE_EXHAUSTED (queue
  // full), UNAVAILABLE (draining), INVALID_ARGUMENT (named field).
  absl::StatusOr<std::shared_ptr<Job>> SubmitGenerate(SessionLease lease, bool throwaway,
                                                      GenerateSpec spec, JobCallbacks callbacks);
  absl::StatusOr<std::shared_ptr<Job>> SubmitScore(SessionLease lease, bool throwaway,
                                                   std::vector<int> input, bool commit,
                                                   JobCallbacks callbacks);
  absl::StatusOr<std::shared_ptr<Job>> SubmitFork(SessionLease source, absl::Duration idle_ttl,
                                                  std::map<std::string, std::string> labels,
                                                  JobCallbacks callbacks);
  // Export: the session's state as SessionExport bytes (JobResult::exported).
  absl::StatusOr<std::shared_ptr<Job>> SubmitExport(SessionLease lease, JobCallbacks callbacks);
  // Import: a new session from a decoded export whose fingerprint the caller
  // has checked (JobResult::forked).
  struct ImportSpec {
    std::string owner;
    SessionExport image;
    absl::Duration idle_ttl;
    std::map<std::string, std::string> labels;
    std::string id;           // as SessionTable::Create
    int64_t max_mem_len = 0;  // a larger window in the image: INVALID_ARGUMENT
  };
  absl::StatusOr<std::shared_ptr<Job>> SubmitImport(ImportSpec spec, JobCallbacks callbacks);
  // Adopt: claims a session that the state store holds for no live replica,
  // and adds it here (out of device memory) for `caller`, its owner.
  // NOT_FOUND (none, or another principal's), UNAVAILABLE (a live replica
  // serves it), DATA_LOSS (damaged; quarantined). Needs a journal.
  absl::StatusOr<std::shared_ptr<Job>> SubmitAdopt(std::string caller, std::string id, JobCallbacks callbacks);
  // After Stop(): writes a snapshot of every journaled session still in
  // device memory (a graceful restart then replays nothing) and waits for
  // the journal. The caller's thread does the engine work (it is the only one left).
  absl::Status SnapshotAll();
  // The job leaves the batch at the next step and ends with Finish::kCancelled.
  void Cancel(const std::shared_ptr<Job>& job);
  // Flow control for a client that reads slower than the job produces: a
  // paused job is left out of the batch (others go on) until Resume, or is
  // cancelled with StalledError after stall_timeout.
  void Pause(const std::shared_ptr<Job>& job);
  void Resume(const std::shared_ptr<Job>& job);

  int64_t queue_depth() const;
  int64_t active() const { return active_count_.load(); }

 private:
  absl::StatusOr<std::shared_ptr<Job>> Enqueue(std::shared_ptr<Job> job);
  void Loop();
  void RunStep(std::vector<std::shared_ptr<Job>>& active);
  void Finish(Job& job, absl::Status status);
  void ReturnLease(Job& job);
  absl::Status Import(Job& job);  // engine thread
  absl::Status Adopt(Job& job);   // engine thread
  // Engine thread: brings an offloaded session's state back (lease.idle or the journal).
  absl::Status Materialize(Job& job);
  absl::StatusOr<std::unique_ptr<EngineSession>> Rebuild(const IdleSession& idle);
  // Engine thread: moves idle sessions out of device and host memory per the
  // budgets. Host memory only grows by offloads, so it is checked after one
  // (and at the tick, for sessions recovered at start).
  void Offload(bool tick);
  // Engine thread: lets go of the sessions other replicas asked for, once idle.
  void HandOff();
  // Journal: logs the job's history up to `position`; runs fn once that is written.
  void LogHistory(Job& job, int64_t position);
  // Engine thread: the session's ExportSession bytes (its state in device memory).
  absl::StatusOr<std::string> ExportImage(const SessionLease& lease) const;
  // Runs fn after the journal has written what came before (durable jobs), or now.
  void Ack(bool durable, std::function<void(absl::Status)> fn);
  // UNAVAILABLE when the job would change a journaled session while the
  // state store cannot be written: refused before anything changes.
  absl::Status CheckWritable(const SessionLease& lease, bool throwaway) const;
  // Journals a session made on the engine thread (fork, import), held
  // (busy) in `lease` meanwhile, from its export bytes; then releases it (or
  // drops it if the id was taken in the store) and ends the job with that.
  void RecordNewSession(Job& job, const SessionInfo& info, SessionLease lease, std::string snapshot);

  const SchedulerConfig config_;
  Engine* const engine_;
  SessionTable* const table_;
  const Tokenizer* const tokenizer_;
  SchedulerObserver* const observer_;
  SessionJournal* journal_ = nullptr;

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> wanted_ ABSL_GUARDED_BY(mu_);  // sessions to hand over
  int64_t resumed_ ABSL_GUARDED_BY(mu_) = 0;          // Resume calls: wakes a loop whose jobs are all paused

  std::atomic<int64_t> active_count_{0};
  size_t rotate_ = 0;  // engine thread only: where the decoders' turn starts when they exceed max_batch
  std::thread thread_;
};

// The state a journal record rebuilds: its image, then every history token
// but the last, which stays pending (returned in `pending`).
std::shared_ptr<IdleSession> IdleFromRecord(const JournalRecord& record, std::vector<int>* pending);

// Startup: registers the sessions this replica held when it last ran (a
// restart, or a crash) in `store`, out of device memory; each comes back on
// its first request. A damaged one is reported and quarantined, one of
// another model is reported and left alone, and the rest still load.
// Returns how many were registered.
absl::StatusOr<int> RecoverSessions(SessionJournal* journal, SessionTable* table, const std::string& fingerprint);

}  // namespace txl

#endif  // TXL_SERVER_BATCHING_SCHEDULER_H_
