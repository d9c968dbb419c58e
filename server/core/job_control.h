// JobControl: a transport's hold on one job it started through the service
// core (a generation or a score): cancel, pause, resume. Calls made before
// the job is known apply once it is (a client that left before the job was
// queued); after it ended they do nothing. A Converse stream keeps one for
// all its turns, so a pause for a full buffer carries over to the next turn.
// A call that runs several jobs at once (the choices of a generation with
// n > 1) gives each a child control: what the call does reaches them all.
//
// Threading: thread-safe. Lock order: a caller's own lock, then this one,
// then its children's, then the scheduler's.
#ifndef TXL_SERVER_CORE_JOB_CONTROL_H_
#define TXL_SERVER_CORE_JOB_CONTROL_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/batching/scheduler.h"

namespace txl {

class JobControl {
 public:
  explicit JobControl(Scheduler* scheduler) : scheduler_(scheduler) {}

  void Cancel();
  // Pause: the job is left out of the batch until Resume (Scheduler::Pause).
  void Pause();
  void Resume();
  bool cancelled() const;

  // The service core's side: the job once queued, and its end. A job can
  // end (on the engine thread) before the core attaches it: such a job is
  // not kept (a call would hold it, and what its callbacks hold, for nothing).
  void Attach(std::shared_ptr<Job> job);
  void Detach();
  // This control's or a child's job.
  bool holds_job() const;
  // A control for one more job of the same call: Cancel, Pause and Resume,
  // made before or after, reach it too.
  std::shared_ptr<JobControl> AddChild();

 private:
  Scheduler* const scheduler_;
  mutable absl::Mutex mu_;
  std::shared_ptr<Job> job_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  int ended_unattached_ ABSL_GUARDED_BY(mu_) = 0;                           // jobs that ended before Attach
  std::vector<std::shared_ptr<JobControl>> children_ ABSL_GUARDED_BY(mu_);  // locked after mu_
};

}  // namespace txl

#endif  // TXL_SERVER_CORE_JOB_CONTROL_H_
