#include "server/jobs/job_runner.h"
#include "server/jobs/session_jobs.h"
#include "server/jobs/state_at.h"

namespace txl {

ForkJob::ForkJob(SessionLease source, absl::Duration idle_ttl, std::map<std::string, std::string> labels,
                 int64_t position, SessionMade done)
    : MakeSessionJob(std::move(done)), idle_ttl_(idle_ttl), labels_(std::move(labels)), position_(position) {
  lease = std::move(source);
}

void ForkJob::Run(JobRunner& runner) {
  SessionTable* table = runner.table();
  const absl::Time start = absl::Now();
  const int64_t at = position_ == 0 ? lease.position() : position_;
  auto copy = RebuildAt(runner, lease, at);
  if (!copy.ok()) {
    runner.Finish(*this, copy.status());
    return;
  }
  if (position_ != 0 && runner.observer())
    runner.observer()->OnRewind(copy->served, copy->replayed, SecondsSince(start));
  // The fork belongs to whoever may use the source (its owner, the caller).
  const bool durable = runner.journal() != nullptr && lease.durable;
  auto fork = table->CreateAcquired(lease.owner, lease.model, std::move(copy->state), idle_ttl_, labels_, absl::Now(),
                                    SessionTable::NewId(lease.id), durable);
  if (!fork.ok()) {
    runner.Finish(*this, fork.status());
    return;
  }
  fork->pending = std::move(copy->pending);
  fork->history = std::move(copy->history);
  const std::string id = fork->id;
  // Its source's checkpoints up to the fork point hold its history too.
  table->checkpoints().CopyUpTo(lease.id, id, at);
  if (at < lease.position()) runner.Checkpoint(*fork);  // rebuilt: worth keeping
  if (durable) {
    auto image = runner.ExportImage(*fork);
    auto info = table->Get(lease.owner, id);
    if (!image.ok() || !info.ok()) {
      table->Discard(*std::move(fork));
      runner.Finish(*this, image.ok() ? info.status() : image.status());
      return;
    }
    Record(runner, *info, *std::move(fork), *std::move(image));
    runner.Finish(*this, absl::OkStatus());
    return;
  }
  table->Release(*std::move(fork), absl::Now());
  auto info = table->Get(lease.owner, id);
  if (info.ok()) Made(*info);
  runner.Finish(*this, info.status());
}

}  // namespace txl
