#include "server/engine/repository_poller.h"

#include "base/log.h"

namespace txl {

RepositoryPoller::RepositoryPoller(ModelRepository* repository, absl::Duration interval)
    : repository_(repository), interval_(interval), thread_([this] { Loop(); }) {}

RepositoryPoller::~RepositoryPoller() { Stop(); }

void RepositoryPoller::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t RepositoryPoller::polls() const {
  absl::MutexLock l(&mu_);
  return polls_;
}

void RepositoryPoller::Loop() {
  bool failing = false;  // log a failure once, and the recovery
  while (true) {
    {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_);
      if (stopping_) return;
    }
    const absl::Status polled = repository_->Poll();
    if (!polled.ok() && !failing) TXL_LOG(WARNING) << "model repository: " << polled.message();
    if (polled.ok() && failing) TXL_LOG(INFO) << "model repository: polling again";
    failing = !polled.ok();
    absl::MutexLock l(&mu_);
    ++polls_;
  }
}

}  // namespace txl
