#include "server/core/job_control.h"

#include <utility>

namespace txl {

void JobControl::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (job_) scheduler_->Cancel(job_);
  for (const auto& child : children_) child->Cancel();
}

void JobControl::Pause() {
  absl::MutexLock lock(&mu_);
  paused_ = true;
  if (job_) scheduler_->Pause(job_);
  for (const auto& child : children_) child->Pause();
}

void JobControl::Resume() {
  absl::MutexLock lock(&mu_);
  paused_ = false;
  if (job_) scheduler_->Resume(job_);
  for (const auto& child : children_) child->Resume();
}

bool JobControl::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void JobControl::Attach(std::shared_ptr<Job> job) {
  absl::MutexLock lock(&mu_);
  if (ended_unattached_ > 0) {  // it is over already
    --ended_unattached_;
    return;
  }
  job_ = std::move(job);
  if (cancelled_) scheduler_->Cancel(job_);  // the client left before the job was known
  if (paused_) scheduler_->Pause(job_);      // e.g. a turn after one that filled the buffer
}

void JobControl::Detach() {
  absl::MutexLock lock(&mu_);
  if (job_) {
    job_.reset();
  } else {
    ++ended_unattached_;
  }
}

bool JobControl::holds_job() const {
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr) return true;
  for (const auto& child : children_) {
    if (child->holds_job()) return true;
  }
  return false;
}

std::shared_ptr<JobControl> JobControl::AddChild() {
  auto child = std::make_shared<JobControl>(scheduler_);
  absl::MutexLock lock(&mu_);
  if (cancelled_) child->Cancel();
  if (paused_) child->Pause();
  children_.push_back(child);
  return child;
}

}  // namespace txl
