// StateAt: a session's state as it was at an earlier position of its
// history, for RewindJob and ForkJob (docs/SESSIONS.md, "Rewind"). Because the
// state is a function of the history (docs/MODEL.md, "Why it equals the
// authors' computation", point 1), it is rebuilt from the
// nearest image at or before the position (a turn checkpoint, the state
// store's snapshot) by feeding the history tokens between the two; or, when
// the kept history reaches back the model's receptive field, from an empty
// state fed only those tokens (docs/SESSIONS.md, "Bounded replay").
#ifndef TXL_SERVER_JOBS_STATE_AT_H_
#define TXL_SERVER_JOBS_STATE_AT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/jobs/job_runner.h"

namespace txl {

struct StateAt {
  std::unique_ptr<SessionState> state;
  std::vector<int> pending;  // the history's last token, unfed (docs/SESSIONS.md, "History and position")
  TokenHistory history;      // up to the position
  const char* served = "";   // "checkpoint", "replay" or "current" (SchedulerObserver::OnRewind)
  int64_t replayed = 0;      // tokens fed
};

// `lease`'s session (in device memory) as it was at `position`.
// INVALID_ARGUMENT outside [0, its position]; OUT_OF_RANGE when no image and
// kept history reach it (the message names the earliest position that can
// be reached). Engine thread (it may read the state store).
absl::StatusOr<StateAt> RebuildAt(JobRunner& runner, const SessionLease& lease, int64_t position);

}  // namespace txl

#endif  // TXL_SERVER_JOBS_STATE_AT_H_
