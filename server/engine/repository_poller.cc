#include "server/engine/repository_poller.h"

#include <algorithm>

#include "base/log.h"
#include "base/thread_nice.h"

namespace txl {

namespace {

int NiceAbove(int increment) {
  const absl::StatusOr<int> now = ThisThreadNice();
  return std::min(19, (now.ok() ? *now : 0) + std::max(0, increment));
}

}  // namespace

RepositoryPoller::RepositoryPoller(ModelRepository* repository, RepositoryPollerConfig config)
    : repository_(repository), config_(config), nice_(NiceAbove(config.nice_increment)), thread_([this] { Loop(); }) {
  absl::MutexLock l(&sink_->mu);
  sink_->poller = this;
}

RepositoryPoller::~RepositoryPoller() {
  {
    absl::MutexLock l(&sink_->mu);
    sink_->poller = nullptr;
  }
  Stop();
}

VersionReleaser RepositoryPoller::Releaser() const {
  return [sink = sink_](std::shared_ptr<ServedVersion>* version) {
    // In a box that the work shares: refused, the version goes back to the
    // caller, never freed under Sink::mu.
    auto box = std::make_shared<std::shared_ptr<ServedVersion>>(std::move(*version));
    bool queued = false;
    {
      absl::MutexLock l(&sink->mu);
      if (sink->poller != nullptr) queued = sink->poller->RunFirst([box] { box->reset(); });
    }
    if (!queued) *version = std::move(*box);
    return queued;
  };
}

void RepositoryPoller::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool RepositoryPoller::Run(std::function<void()> work) {
  absl::MutexLock l(&mu_);
  if (stopping_) return false;
  work_.push_back(std::move(work));
  return true;
}

bool RepositoryPoller::RunFirst(std::function<void()> work) {
  absl::MutexLock l(&mu_);
  if (stopping_) return false;
  work_.push_front(std::move(work));
  return true;
}

int64_t RepositoryPoller::polls() const {
  absl::MutexLock l(&mu_);
  return polls_;
}

void RepositoryPoller::Loop() {
  // Before any load starts a parallel loop, so that its team inherits it.
  if (absl::Status s = SetThisThreadNice(nice_); !s.ok()) {
    TXL_LOG(WARNING) << "model repository: loads run at the server's priority: " << s.message();
  }
  bool failing = false;  // log a failure once, and the recovery
  absl::Time next_poll = absl::Now() + config_.interval;
  absl::Time next_follow_up = absl::InfiniteFuture();
  while (true) {
    std::function<void()> work;
    {
      absl::MutexLock l(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !work_.empty(); };
      mu_.AwaitWithDeadline(absl::Condition(&woken), std::min(next_poll, next_follow_up));
      if (!work_.empty()) {
        work = std::move(work_.front());
        work_.pop_front();
      } else if (stopping_) {
        return;
      }
    }
    if (work) {
      work();
    } else if (absl::Now() >= next_poll) {
      next_poll = absl::Now() + config_.interval;
      const absl::Status polled = repository_->Poll();
      if (!polled.ok() && !failing) TXL_LOG(WARNING) << "model repository: " << polled.message();
      if (polled.ok() && failing) TXL_LOG(INFO) << "model repository: polling again";
      failing = !polled.ok();
      absl::MutexLock l(&mu_);
      ++polls_;
    }
    bool stopping = false;
    {
      absl::MutexLock l(&mu_);
      stopping = stopping_;
    }
    if (!stopping) next_follow_up = FollowUp();  // not once the server drains: only the queued work is left
  }
}

void RepositoryPoller::SetFollowUp(std::function<absl::Duration()> follow_up) {
  absl::MutexLock l(&follow_up_mu_);
  follow_up_ = std::move(follow_up);
}

absl::Time RepositoryPoller::FollowUp() {
  absl::MutexLock l(&follow_up_mu_);
  if (!follow_up_) return absl::InfiniteFuture();
  const absl::Duration again = follow_up_();
  return again == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + again;
}

}  // namespace txl
