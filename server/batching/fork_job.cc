#include "server/batching/job_runner.h"
#include "server/batching/session_jobs.h"

namespace txl {

ForkJob::ForkJob(SessionLease source, absl::Duration idle_ttl, std::map<std::string, std::string> labels,
                 JobCallbacks cb)
    : idle_ttl_(idle_ttl), labels_(std::move(labels)) {
  lease = std::move(source);
  callbacks = std::move(cb);
}

void ForkJob::Run(JobRunner& runner) {
  SessionTable* table = runner.table();
  auto copy = lease.state->Clone();
  if (!copy.ok()) {
    runner.Finish(*this, copy.status());
    return;
  }
  // The fork belongs to whoever may use the source (its owner, the caller).
  const bool durable = runner.journal() != nullptr && lease.durable;
  auto fork = table->CreateAcquired(lease.owner, *std::move(copy), idle_ttl_, labels_, absl::Now(),
                                    SessionTable::NewId(lease.id), durable);
  if (!fork.ok()) {
    runner.Finish(*this, fork.status());
    return;
  }
  fork->pending = lease.pending;
  const std::string id = fork->id;
  if (durable) {
    auto image = runner.ExportImage(*fork);
    auto info = table->Get(lease.owner, id);
    if (!image.ok() || !info.ok()) {
      table->Discard(*std::move(fork));
      runner.Finish(*this, image.ok() ? info.status() : image.status());
      return;
    }
    runner.RecordNewSession(*this, *info, *std::move(fork), *std::move(image));
    runner.Finish(*this, absl::OkStatus());
    return;
  }
  table->Release(*std::move(fork), absl::Now());
  auto info = table->Get(lease.owner, id);
  if (info.ok()) result.forked = *info;
  runner.Finish(*this, info.status());
}

}  // namespace txl
