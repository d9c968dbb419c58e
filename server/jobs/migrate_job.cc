#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/echo_id.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/session_jobs.h"

namespace txl {

MigrateJob::MigrateJob(SessionLease session, std::shared_ptr<ServedModel> to, JobDone done)
    : to_(std::move(to)), done_(std::move(done)) {
  lease = std::move(session);
}

void MigrateJob::Run(JobRunner& runner) {
  Engine& engine = *to_->engine();
  const int64_t position = lease.position();
  const int64_t mem_len = lease.state->mem_len();
  // The new version's state: its receptive field of the history, fed from an
  // empty state (JobRunner::Rebuild feeds only that much); the last token
  // stays pending, as in every session.
  const int64_t field = engine.ReceptiveField(mem_len);
  const int64_t from = std::max<int64_t>(0, position - 1 - field);
  if (lease.history.start() > from) {
    runner.Finish(*this, absl::OutOfRangeError(absl::StrCat(
                             "session ", EchoId(lease.id), " keeps its history from position ", lease.history.start(),
                             ", and migrating it to ", to_->ref(), " replays it from ", from,
                             " (n_layer x (mem_len - 1) tokens); --session_history_tokens keeps more")));
    return;
  }
  IdleSession idle;
  idle.mem_len = mem_len;
  idle.start = from;
  std::vector<int> pending;
  if (position > 0) {
    idle.feed = lease.history.Slice(from, position);
    pending = {idle.feed.back()};
    idle.feed.pop_back();
  }
  int64_t replayed = 0;
  auto state = runner.Rebuild(engine, idle, JobRunner::RebuildFor::kBeside, &replayed);
  if (!state.ok()) {
    runner.Finish(*this, state.status());  // the session is as it was
    return;
  }
  struct Old {
    std::shared_ptr<ServedModel> model;
    std::unique_ptr<SessionState> state;
    std::vector<int> pending;
  };
  auto old = std::make_shared<Old>(Old{lease.model, std::move(lease.state), lease.pending});
  lease.model = to_;
  lease.state = *std::move(state);
  lease.pending = std::move(pending);
  lease.idle.reset();
  // Its turn checkpoints are the old version's images.
  runner.table()->checkpoints().Drop(lease.id);
  if (!runner.journaled(*this)) {
    runner.Finish(*this, absl::OkStatus());
    return;
  }
  auto image = runner.ExportImage(lease);  // carries the new version's fingerprint
  auto info = runner.table()->Get(lease.owner, lease.id);
  if (!image.ok() || !info.ok()) {  // the session as it was
    lease.model = std::move(old->model);
    lease.state = std::move(old->state);
    lease.pending = std::move(old->pending);
    runner.Finish(*this, !image.ok() ? image.status() : info.status());
    return;
  }
  const SessionMeta meta{info->id, info->owner, info->mem_len, info->idle_ttl, info->created, info->labels, to_->ref()};
  // Busy until the store has the new snapshot and meta; answered then.
  auto held = std::make_shared<SessionLease>(std::move(lease));
  lease = SessionLease();
  const int64_t since_snapshot = std::exchange(held->since_snapshot, 0);
  runner.journal()->RecordMigration(
      meta, position, *std::move(image),
      [table = runner.table(), held, old, since_snapshot, done = std::exchange(done_, nullptr)](absl::Status written) {
        if (!written.ok()) {
          held->model = std::move(old->model);
          held->state = std::move(old->state);
          held->pending = std::move(old->pending);
          held->since_snapshot = since_snapshot;
          if (!absl::IsUnavailable(written)) {
            written = absl::UnavailableError(absl::StrCat("the state store did not record the migration (",
                                                          written.message(), "); the session is as it was"));
          }
        }
        table->Release(std::move(*held), absl::Now());
        if (done) done(written);
      });
  runner.Finish(*this, absl::OkStatus());
}

}  // namespace txl
