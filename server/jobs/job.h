// Job: one request as the engine thread runs it (docs/DESIGN.md, "The scheduler"). Each
// kind is its own type with its own Run (generate_job.h, score_job.h,
// session_jobs.h); the scheduler loop only queues them, calls Run, and lets
// the feeding kinds (Generate, Score) share batched steps (batch_step.h).
// What every kind may touch on the engine thread is JobRunner (job_runner.h).
//
// Each kind answers with its own result type (job_results.h).
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
#include "server/jobs/job_results.h"
#include "server/sessions/session_table.h"

namespace txl {

class FeedJob;
class JobRunner;

// The status of a job cancelled because its client read nothing for
// stall_timeout; IsStalled tells it from a client's own cancel.
absl::Status StalledError(absl::Duration waited);
bool IsStalled(const absl::Status& status);

class Job : public std::enable_shared_from_this<Job> {
 public:
  // A kind's answer (job_results.h) as JobRunner::Finish calls it, maybe
  // later on the journal's thread: with the job's status and the session's
  // position then (where the state store left it, after a rollback).
  using Answer = std::function<void(absl::Status status, int64_t position)>;

  virtual ~Job() = default;

  // Engine thread, each step while the job is active (its session is in
  // device memory by then): a one-shot kind does its work and finishes; a
  // feeding kind gets ready for the step (or finishes if nothing is left).
  virtual void Run(JobRunner& runner) = 0;
  // The kinds that feed tokens in batched steps (Generate, Score); null for
  // the one-shot kinds.
  virtual FeedJob* feeding() { return nullptr; }
  // Its answer waits for the journal's earlier writes (a journaled session, or a new one).
  virtual bool acks_durably() const { return lease.durable; }
  // Once, at the end (JobRunner::Finish), before the lease goes back: the
  // answer with the kind's result, or null when the job has answered by
  // another way (JobRunner::RecordNewSession, a journaled rewind).
  virtual Answer TakeAnswer() = 0;

  SessionLease lease;  // empty id: no session (import, adopt)
  std::atomic<bool> cancelled{false};
  // The client cannot take more output (0: not paused; else when it was
  // paused, in unix nanoseconds).
  std::atomic<int64_t> paused_since{0};
  const absl::Time submitted = absl::Now();
  JobTimes times;  // the runner's queue and total seconds; Generate's first token
  bool done = false;
};

// The feeding kinds' common part: the tokens they feed (the session's
// pending token, then the input) and the history they log.
class FeedJob : public Job {
 public:
  FeedJob(SessionLease session, const std::vector<int>& input);

  FeedJob* feeding() override { return this; }
  // Their place in the next batched step (batch_step.h).
  virtual bool decoding() const { return false; }  // feeds back one sampled token a step
  virtual size_t prefill_left() const = 0;         // input tokens still to feed
  virtual StepInput Row(size_t n) = 0;             // n of them (a decoder: its token)
  virtual void TakeOutput(JobRunner& runner, StepOutput& out, size_t n) = 0;
  // At the end (JobRunner::Finish): settles the session's pending token so
  // that "position = fed + pending" holds whatever happened.
  virtual void Settle(const absl::Status& status) = 0;
  // Whether what it fed stays in the session's history (Score without commit: no).
  virtual bool logs_history() const = 0;

  // With a journal: logs the history the job added up to `position`.
  void LogHistory(JobRunner& runner, int64_t position);
  // Adds what the job committed to the lease's token history (up to its
  // position now; at most `keep` tokens are kept). True when it ends a turn
  // (the session moved on): a checkpoint may be taken.
  bool ExtendHistory(int64_t keep);
  // Materialize found the session's pending token only in the state store:
  // it goes before what the job was given to feed.
  void RestorePending(std::vector<int> pending);
  // A throw-away session that starts empty (a request without a session)
  // feeds only what it must: from the state cache's longest prefix of its
  // input (docs/SESSIONS.md, "The state cache"), or else, of an input longer
  // than the model's receptive field, only its last tokens, into an empty
  // state where they begin ("Bounded replay"). Engine thread, before the
  // first step.
  absl::Status StartStateless(JobRunner& runner);

 protected:
  int64_t input_tokens() const { return static_cast<int64_t>(feed.size() - pending_len); }
  // The prefix fed so far stays; the next token becomes the pending one.
  void KeepFedPrefix();
  // The history tokens the job added at positions [from, to): its input, then what it sampled.
  std::vector<int> Added(int64_t from, int64_t to) const;
  StepInput Slice(size_t n) const;  // feed[fed, fed + n)
  // What is left to feed of all but the last token (which stays pending):
  // the prefill_left of the kinds that predict nothing past their input.
  size_t LeftBeforeLast() const {
    const size_t total = feed.empty() ? 0 : feed.size() - 1;
    return total > fed ? total - fed : 0;
  }
  // The log-probs a row of feed[fed, fed + n) gave its targets (each fed
  // token's next), appended for the input tokens they score (a session's
  // first token: none); before `fed` moves on. Score's, and Generate's echo.
  void AppendScores(const StepOutput& out, size_t n, std::vector<ScoredTokenResult>* scores) const;
  // The state the step advances (Score without commit: a copy).
  virtual SessionState* state() { return lease.state.get(); }

  std::vector<int> feed;
  size_t fed = 0;          // of `feed`
  size_t pending_len = 0;  // how many of `feed` were the session's pending tokens
  // The session's position at submission, how far its history is logged,
  // and the tokens sampled (Generate).
  int64_t start_position = 0, logged_position = 0;
  std::vector<int> generated;
};

}  // namespace txl

#endif  // TXL_SERVER_JOBS_JOB_H_
