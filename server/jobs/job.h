// Job: one request as the engine thread runs it (docs/DESIGN.md, "The scheduler"). Each
// kind is its own type with its own Run (generate_job.h, score_job.h,
// session_jobs.h); the scheduler loop only queues them, calls Run, and lets
// the feeding kinds (Generate, Score) share batched steps (batch_step.h).
// What every kind may touch on the engine thread is JobRunner (job_runner.h).
//
// Threading: `cancelled` and `paused_since` are set from any thread; the
// rest belongs to the engine thread.
#ifndef TXL_SERVER_JOBS_JOB_H_
#define TXL_SERVER_JOBS_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "model/step.h"
#include "server/sessions/session_table.h"

namespace txl {

class JobRunner;

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
  std::string trailing_text;              // Generate: text held back until the end (e.g. a partial character)
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

class Job : public std::enable_shared_from_this<Job> {
 public:
  virtual ~Job() = default;

  // Engine thread, each step while the job is active (its session is in
  // device memory by then): a one-shot kind does its work and finishes; a
  // feeding kind gets ready for the step (or finishes if nothing is left).
  virtual void Run(JobRunner& runner) = 0;

  // Feeding kinds only: their place in the next batched step.
  virtual bool decoding() const { return false; }    // feeds back one sampled token a step
  virtual size_t prefill_left() const { return 0; }  // input tokens still to feed
  virtual StepInput Row(size_t n) { return {}; }     // n of them (a decoder: its token)
  virtual void TakeOutput(JobRunner& runner, StepOutput& out, size_t n) {}

  // At the end (JobRunner::Finish): settles the session's pending token so
  // that "position = fed + pending" holds whatever happened.
  virtual void Settle(const absl::Status& status) {}
  // With a journal: logs the history the job added up to `position`.
  virtual void LogHistory(JobRunner& runner, int64_t position) {}
  // Adds what the job committed to the lease's token history (up to its
  // position now; at most `keep` tokens are kept). True when it ends a turn
  // (the session moved on): a checkpoint may be taken.
  virtual bool ExtendHistory(int64_t keep) { return false; }
  virtual bool logs_history() const { return false; }
  // Its answer waits for the journal's earlier writes (a journaled session, or a new one).
  virtual bool acks_durably() const { return lease.durable; }
  // Materialize found the session's pending token only in the state store.
  virtual void RestorePending(std::vector<int> pending) { lease.pending = std::move(pending); }
  // The state the step advances (Score without commit: a copy).
  virtual SessionState* state() { return lease.state.get(); }

  SessionLease lease;  // empty id: no session (import, adopt)
  JobCallbacks callbacks;
  std::atomic<bool> cancelled{false};
  // The client cannot take more output (0: not paused; else when it was
  // paused, in unix nanoseconds).
  std::atomic<int64_t> paused_since{0};
  const absl::Time submitted = absl::Now();
  JobResult result;
  bool done = false;
};

// The feeding kinds' common part: the tokens they feed (the session's
// pending token, then the input) and the history they log.
class FeedJob : public Job {
 public:
  FeedJob(SessionLease session, const std::vector<int>& input, JobCallbacks cb);

  void LogHistory(JobRunner& runner, int64_t position) override;
  bool ExtendHistory(int64_t keep) override;
  void RestorePending(std::vector<int> pending) override;

  std::vector<int> feed;
  size_t fed = 0;          // of `feed`
  size_t pending_len = 0;  // how many of `feed` were the session's pending tokens
  // The session's position at submission, how far its history is logged,
  // and the tokens sampled (Generate).
  int64_t start_position = 0, logged_position = 0;
  std::vector<int> generated;

 protected:
  // The prefix fed so far stays; the next token becomes the pending one.
  void KeepFedPrefix();
  // The history tokens the job added at positions [from, to): its input, then what it sampled.
  std::vector<int> Added(int64_t from, int64_t to) const;
  StepInput Slice(size_t n) const;  // feed[fed, fed + n)
};

}  // namespace txl

#endif  // TXL_SERVER_JOBS_JOB_H_
