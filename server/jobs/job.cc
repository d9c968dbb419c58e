#include "server/jobs/job.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/session_jobs.h"

namespace txl {
namespace {

constexpr char kStalledPayload[] = "txl.stalled";

}  // namespace

absl::Status StalledError(absl::Duration waited) {
  absl::Status s = absl::CancelledError(
      absl::StrCat("the client read none of its stream for ", absl::FormatDuration(waited),
                   " (the stall timeout); the call was cancelled and the session keeps what was generated"));
  s.SetPayload(kStalledPayload, absl::Cord("1"));
  return s;
}

bool IsStalled(const absl::Status& status) { return status.GetPayload(kStalledPayload).has_value(); }

Job::Answer AnswerStatus(JobDone done) {
  if (!done) return nullptr;
  return [done = std::move(done)](absl::Status status, int64_t) { done(std::move(status)); };
}

void MakeSessionJob::Record(JobRunner& runner, const SessionInfo& info, SessionLease lease, std::string snapshot) {
  runner.RecordNewSession(info, std::move(lease), std::move(snapshot), std::exchange(done_, nullptr));
}

FeedJob::FeedJob(SessionLease session, const std::vector<int>& input) {
  lease = std::move(session);
  start_position = logged_position = lease.position();
  // The pending token stays in the lease until the job ends (Settle): a job
  // the queue refuses hands the session back unchanged.
  feed = lease.pending;
  pending_len = feed.size();
  feed.insert(feed.end(), input.begin(), input.end());
}

void FeedJob::KeepFedPrefix() {
  if (fed > 0) lease.pending = {feed[fed]};
}

void FeedJob::AppendScores(const StepOutput& out, size_t n, std::vector<ScoredTokenResult>* scores) const {
  if (fed == 0 && pending_len == 0) scores->push_back({feed[0], false, 0.0f});  // nothing predicts it
  for (size_t k = 0; k < out.target_logprobs.size() && k < n; ++k) {
    const size_t pos = fed + 1 + k;
    if (pos >= pending_len) scores->push_back({feed[pos], true, out.target_logprobs[k]});
  }
}

StepInput FeedJob::Slice(size_t n) const {
  StepInput in;
  in.tokens.assign(feed.begin() + fed, feed.begin() + fed + n);
  return in;
}

void FeedJob::RestorePending(std::vector<int> pending) {
  // Rolled back after a store failure: the pending token is only in the store.
  feed.insert(feed.begin(), pending.begin(), pending.end());
  pending_len += pending.size();
  lease.pending = std::move(pending);
}

absl::Status FeedJob::StartStateless(JobRunner& runner) {
  if (!lease.throwaway || !lease.state || fed > 0 || pending_len > 0 || lease.state->position() != 0)
    return absl::OkStatus();
  const int64_t mem_len = lease.state->mem_len();
  const size_t field = static_cast<size_t>(JobRunner::EngineOf(lease).ReceptiveField(mem_len));
  const size_t skip = feed.size() > field ? feed.size() - field : 0;
  if (auto hit = runner.FromStateCache(lease, feed, skip); hit.has_value()) {
    fed = static_cast<size_t>(*hit);
    return absl::OkStatus();
  }
  if (skip == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(lease.state, JobRunner::EngineOf(lease).NewSessionAt(mem_len, static_cast<int64_t>(skip)));
  fed = skip;
  return absl::OkStatus();
}

std::vector<int> FeedJob::Added(int64_t from, int64_t to) const {
  const int64_t n_input = static_cast<int64_t>(feed.size() - pending_len);
  std::vector<int> tokens;
  for (int64_t i = from - start_position; i < to - start_position; ++i) {
    tokens.push_back(i < n_input ? feed[pending_len + i] : generated[i - n_input]);
  }
  return tokens;
}

bool FeedJob::ExtendHistory(int64_t keep) {
  const int64_t end = lease.position();
  if (end <= start_position) return false;
  // A history that does not end where the job began cannot go on (a bug
  // elsewhere): it restarts here rather than hold tokens at wrong positions.
  if (lease.history.end() != start_position) lease.history = TokenHistory(start_position);
  lease.history.Append(Added(start_position, end), keep);
  return true;
}

void FeedJob::LogHistory(JobRunner& runner, int64_t position) {
  if (!runner.journaled(*this) || !logs_history() || position <= logged_position) return;
  runner.journal()->RecordTokens(lease.id, logged_position, Added(logged_position, position));
  lease.since_snapshot += position - logged_position;
  logged_position = position;
}

}  // namespace txl
