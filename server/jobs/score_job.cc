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
  AppendScores(out, n, &scores_);
  fed += n;
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
