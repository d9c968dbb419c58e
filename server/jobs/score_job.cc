#include "server/jobs/score_job.h"

#include "server/jobs/job_runner.h"

namespace txl {

void ScoreJob::Run(JobRunner& runner) {
  if (!commit_ && !scratch_) {
    auto copy = lease.state->Clone();
    if (!copy.ok()) {
      runner.Finish(*this, copy.status());
      return;
    }
    scratch_ = *std::move(copy);
  }
  if (prefill_left() == 0) {
    // One token and nothing before it: nothing to predict.
    if (scores_.empty()) {
      for (size_t i = pending_len; i < feed.size(); ++i) scores_.push_back({feed[i], false, 0.0f});
    }
    runner.Finish(*this, absl::OkStatus());
  }
}

StepInput ScoreJob::Row(size_t n) {
  StepInput in = Slice(n);
  in.session = state();
  in.targets.assign(feed.begin() + fed + 1, feed.begin() + fed + n + 1);
  return in;
}

void ScoreJob::TakeOutput(JobRunner& runner, StepOutput& out, size_t n) {
  fed += n;
  // Scores come for feed positions fed-n+1 .. fed; report input tokens only.
  const size_t first_target = fed - n + 1;
  if (scores_.empty() && pending_len == 0) {
    scores_.push_back({feed[0], false, 0.0f});  // the session's first token
  }
  for (size_t k = 0; k < out.target_logprobs.size(); ++k) {
    const size_t pos = first_target + k;
    if (pos >= pending_len) scores_.push_back({feed[pos], true, out.target_logprobs[k]});
  }
  if (prefill_left() == 0) runner.Finish(*this, absl::OkStatus());
}

void ScoreJob::Settle(const absl::Status& status) {
  scratch_.reset();
  if (!commit_) return;  // the session is as it was
  if (status.ok()) {
    lease.pending = {feed.back()};
  } else {
    KeepFedPrefix();
  }
}

Job::Answer ScoreJob::TakeAnswer() {
  if (!done_) return nullptr;
  return [done = std::move(done_), scores = std::move(scores_)](absl::Status status, int64_t position) mutable {
    ScoreResult r;
    r.position = position;
    r.scores = std::move(scores);
    done(std::move(status), std::move(r));
  };
}

}  // namespace txl
