// SessionJournal's holds on its sessions between replicas: the heartbeat,
// CheckHold and Lost, the writer thread's re-check of every hold after a gap
// in the heartbeats (VerifyHolds), and the hand-over of sessions another
// replica asked for or took over (FindWanted, the handoff handler).
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/echo_id.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "server/durability/session_journal.h"
#include "server/durability/session_journal_internal.h"

namespace txl {

using session_journal_internal::Key;
using session_journal_internal::Moved;
using session_journal_internal::WantedKey;

absl::Status SessionJournal::Heartbeat() {
  const absl::Time sent = absl::Now();
  RETURN_IF_ERROR(backend_->Put(absl::StrCat("replicas/", config_.replica), absl::StrCat(absl::ToUnixNanos(sent))));
  absl::MutexLock lock(&mu_);
  // Another replica takes this one's sessions once its heartbeat is
  // holder_timeout old. Half that since the last beat (a pause, a store
  // that did not answer): every hold must be checked again (CheckHold).
  if (beat_sent_ != absl::Time() && sent - beat_sent_ > config_.holder_timeout / 2) {
    for (auto& [id, t] : tracked_) t.verified = false;
  }
  beat_sent_ = sent;
  return absl::OkStatus();
}

bool SessionJournal::Lost(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = tracked_.find(id);
  return it != tracked_.end() && it->second.lost;
}

absl::Status SessionJournal::CheckHold(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = tracked_.find(id);
  if (it == tracked_.end()) return absl::OkStatus();  // not journaled here
  Tracked& t = it->second;
  if (t.lost) return Moved(id);
  if (absl::Now() - beat_sent_ > config_.holder_timeout / 2) {  // a gap now: another replica may take over
    for (auto& [other, tracked] : tracked_) tracked.verified = false;
  }
  if (t.verified || t.unresolved) return absl::OkStatus();  // unresolved: busy, and re-fenced before it is served
  return absl::UnavailableError(absl::StrCat("session ", EchoId(id),
                                             ": this replica is checking with the state store that it still "
                                             "serves the session (its heartbeats had a gap); retry"));
}

void SessionJournal::VerifyHolds() {
  std::vector<std::pair<std::string, std::string>> unverified;  // id, token
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, t] : tracked_) {
      if (!t.verified && !t.lost && !t.unresolved) unverified.emplace_back(id, t.token);
    }
  }
  for (const auto& [id, token] : unverified) {
    auto holder = backend_->Get(Key(id, "holder"));
    if (!holder.ok() && !absl::IsNotFound(holder.status())) return;  // at the next heartbeat
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(id);
    if (it == tracked_.end() || it->second.token != token || it->second.unresolved)
      continue;  // claimed again meanwhile
    if (holder.ok() && *holder == token) {
      it->second.verified = true;
    } else {
      TXL_LOG(WARNING) << "session " << id << ": another replica holds it now; this replica lets its copy go";
      it->second.lost = true;
      newly_lost_.push_back(id);
    }
  }
}

void SessionJournal::SetHandoffHandler(std::function<void(std::vector<std::string>)> handler) {
  absl::MutexLock lock(&handoff_mu_);
  handoff_ = std::move(handler);
}

SessionJournal::Handoff SessionJournal::HandoffOf(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = tracked_.find(id);
  if (it == tracked_.end()) return Handoff::kKeep;
  if (it->second.lost) return Handoff::kDiscard;
  // Waiting for room for its version: kept for this replica's restart (an
  // adoption never loads a version, so the one asking could only let it go).
  if (waiting_.count(id) != 0) return Handoff::kKeep;
  return it->second.wanted ? Handoff::kHandOver : Handoff::kKeep;
}

void SessionJournal::FindWanted() {
  {
    absl::MutexLock lock(&handoff_mu_);
    if (!handoff_) return;
  }
  // Sessions another replica took over: the scheduler lets go of its copies
  // (the hand-over's writes are refused; the copies are discarded).
  std::vector<std::string> lost;
  {
    absl::MutexLock lock(&mu_);
    lost.swap(newly_lost_);
  }
  if (!lost.empty()) {
    absl::MutexLock lock(&handoff_mu_);
    if (handoff_) handoff_(std::move(lost));
  }
  // Only this replica's requests: the scan runs between group commits, so
  // it must not grow with the number of sessions in the store.
  const std::string prefix = WantedKey(config_.replica, "");
  auto keys = backend_->List(prefix);
  if (!keys.ok()) return;
  std::vector<std::string> wanted;
  for (const std::string& key : *keys) {
    const std::string id = key.substr(prefix.size());
    auto holder = backend_->Get(Key(id, "holder"));
    auto asked = backend_->Get(key);  // "<asker> <the holder token it saw>"
    bool ours = false;
    if (holder.ok() && asked.ok()) {
      // A request made before this replica's current claim (it saw an
      // earlier token) is stale: the session came here after it.
      const size_t space = asked->find(' ');
      const bool current = space == std::string::npos || asked->substr(space + 1) == *holder;
      absl::MutexLock lock(&mu_);
      auto it = tracked_.find(id);
      ours = current && it != tracked_.end() && !it->second.lost && it->second.token == *holder;
      if (ours) it->second.wanted = true;
    }
    if (ours) {
      wanted.push_back(id);
    } else if ((absl::IsNotFound(holder.status()) || holder.ok()) && (asked.ok() || absl::IsNotFound(asked.status()))) {
      (void)backend_->Delete(key);  // no longer ours to hand over
    }
  }
  if (wanted.empty()) return;
  absl::MutexLock lock(&handoff_mu_);  // the handler's owner cannot go while it runs
  if (handoff_) handoff_(std::move(wanted));
}

}  // namespace txl
