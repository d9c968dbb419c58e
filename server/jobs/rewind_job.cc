#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/session_jobs.h"
#include "server/jobs/state_at.h"

namespace txl {

RewindJob::RewindJob(SessionLease session, int64_t position, JobDone done)
    : position_(position), done_(std::move(done)) {
  lease = std::move(session);
}

void RewindJob::Run(JobRunner& runner) {
  const absl::Time start = absl::Now();
  const int64_t before = lease.position();
  StateAt at;
  if (position_ == before) {
    at.served = "current";  // nothing to do
  } else {
    auto rebuilt = RebuildAt(runner, lease, position_);
    if (!rebuilt.ok()) {
      runner.Finish(*this, rebuilt.status());  // the session is as it was
      return;
    }
    at = *std::move(rebuilt);
  }
  if (runner.observer()) runner.observer()->OnRewind(at.served, at.replayed, SecondsSince(start));
  if (position_ == before) {
    runner.Finish(*this, absl::OkStatus());
    return;
  }
  // The old state stays until the state store has the rewind (a failed
  // write puts it back). Checkpoints past the position hold a history that
  // no longer exists.
  struct Old {
    std::unique_ptr<SessionState> state;
    std::vector<int> pending;
    TokenHistory history;
  };
  auto old = std::make_shared<Old>();
  old->pending = lease.pending;
  old->history = lease.history;
  old->state = std::move(lease.state);
  lease.state = std::move(at.state);
  lease.pending = std::move(at.pending);
  lease.history = std::move(at.history);
  runner.table()->checkpoints().DropAfter(lease.id, position_);
  if (at.replayed > 0) runner.Checkpoint(lease);  // the next rewind near here is a copy (else it is one already)
  if (!runner.journaled(*this)) {
    runner.Finish(*this, absl::OkStatus());
    return;
  }
  auto image = runner.ExportImage(lease);
  if (!image.ok()) {
    lease.state = std::move(old->state);
    lease.pending = std::move(old->pending);
    lease.history = std::move(old->history);
    runner.Finish(*this, image.status());
    return;
  }
  // Busy until written; answered then (RecordRewind's callback, on the writer thread).
  auto held = std::make_shared<SessionLease>(std::move(lease));
  lease = SessionLease();
  held->since_snapshot = std::max<int64_t>(0, held->since_snapshot - (before - position_));
  runner.journal()->RecordRewind(
      held->id, position_, *std::move(image),
      [table = runner.table(), held, old, done = std::exchange(done_, nullptr)](absl::Status written) {
        if (!written.ok()) {
          held->state = std::move(old->state);
          held->pending = std::move(old->pending);
          held->history = std::move(old->history);
          if (!absl::IsUnavailable(written)) {
            written = absl::UnavailableError(absl::StrCat("the state store did not record the rewind (",
                                                          written.message(), "); the session is as it was"));
          }
        }
        table->Release(std::move(*held), absl::Now());
        if (done) done(written);
      });
  runner.Finish(*this, absl::OkStatus());
}

}  // namespace txl
