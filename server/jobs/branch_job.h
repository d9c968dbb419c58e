// BranchJob: the start of a call with several choices (ServiceCore::Generate's
// n and best_of). It feeds the prompt into the call's throw-away session
// once, all but its last token (which stays pending, as after a committed
// score), and then copies the session, so that each choice's GenerateJob
// starts from the prompt's state and first feeds only that last token.
#ifndef TXL_SERVER_JOBS_BRANCH_JOB_H_
#define TXL_SERVER_JOBS_BRANCH_JOB_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "server/jobs/job.h"

namespace txl {

// The sessions a BranchJob made: its own first, then the copies; each is
// acquired and throw-away, with the prompt's last token pending.
struct Branches {
  std::vector<SessionLease> leases;
  int64_t input_tokens = 0;  // the prompt's
  JobTimes times;            // the prompt's feed
};
using BranchDone = std::function<void(absl::StatusOr<Branches>)>;

class BranchJob final : public FeedJob {
 public:
  // `lease`: a throw-away session; `copies` more are made of it. `done` gets
  // the sessions, or the error (a copy the session table refuses: its
  // limits count each copy as a session).
  BranchJob(SessionLease lease, const std::vector<int>& input, int copies, BranchDone done)
      : FeedJob(std::move(lease), input), copies_(copies), done_(std::move(done)) {}

  void Run(JobRunner& runner) override;
  Answer TakeAnswer() override;
  size_t prefill_left() const override { return LeftBeforeLast(); }
  StepInput Row(size_t n) override;
  void TakeOutput(JobRunner& runner, StepOutput& out, size_t n) override;
  void Settle(const absl::Status& status) override;
  bool logs_history() const override { return false; }  // throw-away: never journaled

 private:
  // The prompt is fed: copies the session and finishes.
  void Branch(JobRunner& runner);

  const int copies_;
  BranchDone done_;
  bool started_ = false;            // the state cache was asked (once)
  std::vector<SessionLease> made_;  // the copies, once all are made
  bool branched_ = false;
};

}  // namespace txl

#endif  // TXL_SERVER_JOBS_BRANCH_JOB_H_
