// Offload: between steps the engine thread moves idle sessions out of
// device memory (to host images) and host memory (to the state store only)
// per the table's budgets, lets go of sessions other replicas asked for
// (hand-over), and at shutdown snapshots what is left. docs/DESIGN.md, "The
// scheduler: one engine thread, continuous batching" (Offloader), and
// docs/SESSIONS.md, "Tiers and expiry".
#ifndef TXL_SERVER_BATCHING_OFFLOAD_H_
#define TXL_SERVER_BATCHING_OFFLOAD_H_

#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/jobs/job_runner.h"

namespace txl {

class Offloader {
 public:
  explicit Offloader(JobRunner* runner) : runner_(runner) {}

  // Any thread (the journal's writer): sessions to hand over when idle.
  void Want(const std::vector<std::string>& ids);
  // Engine thread. Host memory only grows by offloads, so it is checked
  // after one (and at the tick, for sessions recovered at start).
  void Offload(bool tick);
  // Engine thread: lets go of the sessions other replicas asked for, once idle.
  void HandOff();
  // After the engine thread stopped: a snapshot of every journaled session
  // still in device memory (a graceful restart then replays nothing), then
  // waits for the journal.
  absl::Status SnapshotAll();

 private:
  JobRunner* const runner_;
  absl::Mutex mu_;
  std::set<std::string> wanted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_SERVER_BATCHING_OFFLOAD_H_
