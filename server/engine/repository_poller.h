// RepositoryPoller: a thread that polls a ModelRepository every interval
// (--repository_poll_seconds), so that a version published into the
// directory is loaded, and one removed is retired, with no restart. A failed
// poll (the directory gone for a moment) is logged and the next one tries
// again; the versions already loaded go on serving. It also runs the
// repository work a request asks for (Run: an explicit load or unload),
// which may take seconds and so never runs on a transport's thread.
//
// Priority: the thread runs at a nice value `nice_increment` above the
// thread that made the poller (19 at most), and any thread it starts (an
// OpenMP team for a load's parallel loops) inherits it. A load (reading,
// packing and timing the weights, the warm-up step) then gives way to the
// engine's steps on a busy host (nice 19 weighs 1.5% of nice 0), which is
// what keeps the live streams' inter-token gaps flat during a reload
// (bench/reload.py, R2); a load on a saturated host takes longer instead.
// The other side of inheritance: a pool the poller's thread started first
// and others shared later would keep the low priority. A reload on the CPU
// starts no thread (the server's thread list is unchanged after one); on a
// GPU, the start-up load on the main thread has made the device's context,
// and every version uses the same --device.
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

struct RepositoryPollerConfig {
  // > 0; absl::InfiniteDuration(): no polls, only the work Run queues.
  absl::Duration interval = absl::InfiniteDuration();
  // >= 0 (--repository_load_nice); 0 keeps the creating thread's priority.
  int nice_increment = 19;
};

class RepositoryPoller {
 public:
  // `repository` must outlive the poller.
  RepositoryPoller(ModelRepository* repository, RepositoryPollerConfig config);
  ~RepositoryPoller();  // Stop()s
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `work` for the poller's thread; false (and `work` is dropped)
  // once Stop has begun.
  bool Run(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);
  // As Run, ahead of the work already queued (a release: its memory may be
  // what a queued load needs).
  bool RunFirst(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);
  // Polls finished so far, failed ones included.
  int64_t polls() const ABSL_LOCKS_EXCLUDED(mu_);
  // Runs on the poller's thread after each poll and each piece of work
  // (WaitingReadmitter: room may have been made), and again at the latest
  // after the duration it returns (infinite: no need); null: nothing. Not
  // once Stop has begun. Setting another waits for a call in progress.
  void SetFollowUp(std::function<absl::Duration()> follow_up) ABSL_LOCKS_EXCLUDED(follow_up_mu_);
  // For ModelRepository::SetReleaser: a version let go of is freed on this
  // thread (RunFirst); once Stop has begun, or the poller is gone, it is
  // refused, and freed where it was dropped, after every lock here.
  VersionReleaser Releaser() const;

 private:
  // The releasers' way to this poller, which they may outlive.
  struct Sink {
    absl::Mutex mu;
    RepositoryPoller* poller ABSL_GUARDED_BY(mu) = nullptr;
  };
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs the follow-up, if any; returns when it asks to run again.
  absl::Time FollowUp() ABSL_LOCKS_EXCLUDED(follow_up_mu_);

  ModelRepository* const repository_;
  const RepositoryPollerConfig config_;
  const int nice_;  // the creating thread's value plus the increment
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> work_ ABSL_GUARDED_BY(mu_);
  int64_t polls_ ABSL_GUARDED_BY(mu_) = 0;
  const std::shared_ptr<Sink> sink_ = std::make_shared<Sink>();
  // Its own mutex, held while it runs (see SetFollowUp).
  absl::Mutex follow_up_mu_;
  std::function<absl::Duration()> follow_up_ ABSL_GUARDED_BY(follow_up_mu_);
  std::thread thread_;
};

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_REPOSITORY_POLLER_H_
