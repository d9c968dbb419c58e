// ScoreJob: the log-probability of each input token given everything before
// it. It feeds the session's pending token and all but the last input token
// (nothing predicts past the last, which stays pending). Without commit it
// works on a copy and the session does not change.
#ifndef TXL_SERVER_JOBS_SCORE_JOB_H_
#define TXL_SERVER_JOBS_SCORE_JOB_H_

#include <memory>
#include <vector>

#include "server/jobs/job.h"

namespace txl {

class ScoreJob final : public FeedJob {
 public:
  ScoreJob(SessionLease lease, const std::vector<int>& input, bool commit, ScoreDone done)
      : FeedJob(std::move(lease), input), commit_(commit), done_(std::move(done)) {}

  void Run(JobRunner& runner) override;
  Answer TakeAnswer() override;
  size_t prefill_left() const override { return LeftBeforeLast(); }
  StepInput Row(size_t n) override;
  void TakeOutput(JobRunner& runner, StepOutput& out, size_t n) override;
  void Settle(const absl::Status& status) override;
  bool logs_history() const override { return commit_; }

 private:
  SessionState* state() override { return scratch_ ? scratch_.get() : lease.state.get(); }

  const bool commit_;
  ScoreDone done_;
  std::vector<ScoredTokenResult> scores_;
  std::unique_ptr<SessionState> scratch_;  // commit=false works on a copy
};

}  // namespace txl

#endif  // TXL_SERVER_JOBS_SCORE_JOB_H_
