// WaitingReadmitter: brings back, with no restart, the sessions recovered at
// start-up whose version did not fit --model_memory_budget
// (SessionJournal::Wait). For each version such sessions wait for, it asks
// the repository to Keep it again, which refuses before loading while it
// still does not fit; the sessions of a version it kept are adopted here, on
// that version, as a restart with room would recover them.
// - A version whose file is gone, or that no longer has a session's
//   fingerprint, lets its sessions go, as a restart does (a replica that
//   serves it may adopt them).
// - A model an operator unloaded is left alone until it is loaded again.
// - A load that fails, or an adoption that fails (the store unavailable, the
//   scheduler's queue full or draining), puts the sessions back to wait,
//   tried again after kWaitingRetryBackoff rather than at once: the version
//   is freed with the job, and the next try loads it again. With the store
//   not writable, nothing is loaded at all.
//
// The server runs it on the repository's thread (RepositoryPoller::
// SetFollowUp) after each poll and each piece of that thread's work (a load,
// an unload, a version freed): whenever room may have been made. It may load
// a version (seconds), so it never runs on a transport's or the engine's
// thread.
#ifndef TXL_SERVER_CORE_READMIT_WAITING_H_
#define TXL_SERVER_CORE_READMIT_WAITING_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/batching/scheduler.h"
#include "server/durability/session_journal.h"
#include "server/engine/model_repository.h"
#include "server/engine/served_model.h"

namespace txl {

struct Readmitted {
  int submitted = 0;  // sessions handed to the scheduler for adoption
  // When to run again for the sessions put back to wait after a failure;
  // infinite when none was.
  absl::Duration again = absl::InfiniteDuration();
};
inline constexpr absl::Duration kWaitingRetryBackoff = absl::Seconds(5);

// One thread at a time (the poller's follow-up). A version refused for the
// budget is not asked for again until the versions' held bytes
// (ModelRepository::HeldBytes) fall below what they were at the refusal:
// with polls every 0.1 s, a refusal's directory scan and sizing would
// otherwise run ten times a second for nothing.
class WaitingReadmitter {
 public:
  // All three must outlive it. `wake` (may be null) makes the caller run
  // Run again soon: an adoption that fails on the engine thread calls it.
  WaitingReadmitter(SessionJournal* journal, ModelRepository* repository, Scheduler* scheduler,
                    std::function<void()> wake = nullptr);
  Readmitted Run();

 private:
  // The version NAME@VERSION `model`, kept loaded; RESOURCE_EXHAUSTED while
  // it does not fit, CANCELLED while its model is unloaded.
  absl::StatusOr<std::shared_ptr<ServedModel>> Kept(const std::string& model);

  SessionJournal* const journal_;
  ModelRepository* const repository_;
  Scheduler* const scheduler_;
  const std::function<void()> wake_;
  std::map<std::string, int64_t> refused_at_;  // NAME@VERSION -> HeldBytes when it was refused
};

}  // namespace txl

#endif  // TXL_SERVER_CORE_READMIT_WAITING_H_
