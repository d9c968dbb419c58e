#include "server/jobs/branch_job.h"

#include <memory>
#include <utility>

#include "server/jobs/job_runner.h"

namespace txl {

void BranchJob::Run(JobRunner& runner) {
  if (feed.empty()) {  // request validation refuses an empty prompt
    runner.Finish(*this, absl::InternalError("branch: nothing to feed"));
    return;
  }
  if (!started_) {  // the state cache's longest prefix, or a long prompt's last receptive field
    started_ = true;
    if (absl::Status s = StartStateless(runner); !s.ok()) {
      runner.Finish(*this, s);
      return;
    }
  }
  if (prefill_left() == 0) Branch(runner);
}

StepInput BranchJob::Row(size_t n) {
  StepInput in = Slice(n);  // no targets, no next token: only the state moves on
  in.session = state();
  return in;
}

void BranchJob::TakeOutput(JobRunner& runner, StepOutput&, size_t n) {
  fed += n;
  if (prefill_left() == 0) Branch(runner);
}

void BranchJob::Branch(JobRunner& runner) {
  const std::vector<int> last = {feed.back()};
  // The prompt's state, for a later call that starts with it (its copy is
  // made once here, not once per choice).
  runner.KeepInStateCache(lease, feed, last);
  SessionTable* table = runner.table();
  std::vector<SessionLease> made;
  absl::Status failed;
  for (int i = 0; i < copies_ && failed.ok(); ++i) {
    auto state = lease.state->Clone();
    if (!state.ok()) {
      failed = state.status();
      break;
    }
    auto copy =
        table->CreateAcquired(lease.owner, lease.model, *std::move(state), absl::ZeroDuration(), {}, absl::Now());
    if (!copy.ok()) {
      failed = copy.status();
      break;
    }
    copy->throwaway = true;
    copy->pending = last;
    made.push_back(*std::move(copy));
  }
  if (!failed.ok()) {
    for (SessionLease& copy : made) table->Discard(std::move(copy));
    runner.Finish(*this, failed);
    return;
  }
  made_ = std::move(made);
  branched_ = true;
  runner.Finish(*this, absl::OkStatus());
}

void BranchJob::Settle(const absl::Status& status) {
  if (status.ok() && branched_) {
    lease.pending = {feed.back()};
  } else if (fed > 0) {
    KeepFedPrefix();
  } else {
    lease.pending.assign(feed.begin(), feed.begin() + pending_len);
  }
}

Job::Answer BranchJob::TakeAnswer() {
  auto branches = std::make_shared<Branches>();
  if (branched_) {  // the sessions go on to the choices; the runner gives nothing back
    branches->input_tokens = input_tokens();
    branches->times = times;
    branches->leases.reserve(made_.size() + 1);
    branches->leases.push_back(std::move(lease));
    lease = SessionLease();
    for (SessionLease& copy : made_) branches->leases.push_back(std::move(copy));
    made_.clear();
  }
  return [done = std::move(done_), branches](absl::Status status, int64_t) {
    // Finish ends a branched job with OK alone: its sessions are never dropped here.
    if (status.ok()) {
      done(std::move(*branches));
    } else {
      done(std::move(status));
    }
  };
}

}  // namespace txl
