// RepositoryPoller: a thread that polls a ModelRepository every interval
// (--repository_poll_seconds), so that a version published into the
// directory is loaded, and one removed is retired, with no restart. A failed
// poll (the directory gone for a moment) is logged and the next one tries
// again; the versions already loaded go on serving. It also runs the
// repository work a request asks for (Run: an explicit load or unload),
// which may take seconds and so never runs on a transport's thread.
//
// Threading: the poller's thread calls Poll and the queued work, one at a
// time; mu_ guards stopping_ and the queue. Stop (or the destructor) wakes
// it and joins it, without waiting out the interval (a load in progress,
// and the work queued before Stop, finish first).
#ifndef TXL_SERVER_ENGINE_REPOSITORY_POLLER_H_
#define TXL_SERVER_ENGINE_REPOSITORY_POLLER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/engine/model_repository.h"

namespace txl {

class RepositoryPoller {
 public:
  // `repository` must outlive the poller; `interval` > 0
  // (absl::InfiniteDuration(): no polls, only the work Run queues).
  RepositoryPoller(ModelRepository* repository, absl::Duration interval);
  ~RepositoryPoller();  // Stop()s
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `work` for the poller's thread; false (and `work` is dropped)
  // once Stop has begun.
  bool Run(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);
  // Polls finished so far, failed ones included.
  int64_t polls() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  ModelRepository* const repository_;
  const absl::Duration interval_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> work_ ABSL_GUARDED_BY(mu_);
  int64_t polls_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_REPOSITORY_POLLER_H_
