#include "server/batching/offload.h"

namespace txl {

void Offloader::Want(const std::vector<std::string>& ids) {
  absl::MutexLock lock(&mu_);
  wanted_.insert(ids.begin(), ids.end());
}

void Offloader::Offload(bool tick) {
  SessionTable* table = runner_->table();
  SchedulerObserver* observer = runner_->observer();
  bool moved = false;
  for (const std::string& id : table->DeviceOverflow()) {
    const absl::Time start = absl::Now();
    // Not busy meanwhile: a request arriving now waits in the queue, not ABORTED.
    std::unique_ptr<SessionState> state = table->BeginOffload(id);
    if (!state) continue;
    auto idle = std::make_shared<IdleSession>();
    idle->mem_len = state->mem_len();
    idle->start = state->position();
    if (!state->AppendTo(&idle->state).ok()) {  // no image: it stays in device memory
      table->AbortOffload(id, std::move(state));
      continue;
    }
    table->FinishOffload(id, std::move(idle));
    moved = true;
    if (observer) observer->OnOffload("host", SecondsSince(start));
  }
  if (!moved && !tick) return;
  for (const std::string& id : table->HostOverflow()) {
    const absl::Time start = absl::Now();
    table->DropToStateStore(id);  // the journal holds it already
    if (observer) observer->OnOffload("store", SecondsSince(start));
  }
}

void Offloader::HandOff() {
  std::set<std::string> wanted;
  {
    absl::MutexLock lock(&mu_);
    wanted.swap(wanted_);
  }
  SessionTable* table = runner_->table();
  SessionJournal* journal = runner_->journal();
  for (const std::string& id : wanted) {
    // Named a while ago: what holds now decides, on this thread, where an
    // adoption since may have claimed it again (then the copy is kept).
    const SessionJournal::Handoff what = journal->HandoffOf(id);
    if (what == SessionJournal::Handoff::kKeep) continue;
    auto lease = table->TakeForSnapshot(id, /*any_tier=*/true);
    if (!lease.ok() || !lease->durable) continue;  // gone, or busy: at the next heartbeat (a lost copy: when used)
    if (what == SessionJournal::Handoff::kHandOver) {
      if (lease->state) {  // its current state, so the next replica replays nothing
        if (auto image = runner_->ExportImage(*lease); image.ok()) journal->RecordSnapshot(id, *std::move(image));
      }
      journal->RecordRelease(id);
    }
    table->Discard(*std::move(lease));
  }
}

absl::Status Offloader::SnapshotAll() {
  SessionJournal* journal = runner_->journal();
  if (journal == nullptr) return absl::OkStatus();
  SessionTable* table = runner_->table();
  // Sessions whose last job's history is being written are busy until it is: settle that first.
  (void)journal->Flush();
  for (const std::string& id : table->Ids()) {
    auto lease = table->TakeForSnapshot(id);  // idle and in device memory
    if (!lease.ok()) continue;
    if (lease->durable) {
      if (auto image = runner_->ExportImage(*lease); image.ok()) {
        journal->RecordSnapshot(id, *std::move(image));
        lease->since_snapshot = 0;
      }
    }
    table->Release(*std::move(lease), absl::Now());
  }
  return journal->Flush();
}

}  // namespace txl
