// SessionJournal's blocking reads: Load (quarantining a damaged session),
// the sessions this replica held (Held), and the claims that take a session
// with a new fencing token: Recover after a restart, Adopt from a dead replica.
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/echo_id.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "server/durability/session_journal.h"
#include "server/durability/session_journal_internal.h"

namespace txl {
namespace {

// The replica a holder value names ("<replica>#<nonce>"; older stores: the name alone).
std::string HolderReplica(const std::string& holder) { return holder.substr(0, holder.find('#')); }

}  // namespace

using session_journal_internal::Key;
using session_journal_internal::Moved;
using session_journal_internal::WantedKey;
using session_journal_internal::WriteOne;

absl::Status SessionJournal::QuarantineSession(const std::string& id, const std::string& why,
                                               const std::string& owner) {
  TXL_LOG(ERROR) << "session " << id << ": " << why << "; its state is quarantined";
  for (const char* part : {"meta", "snap", "log", "holder"}) (void)backend_->Quarantine(Key(id, part));
  absl::MutexLock lock(&mu_);
  ++quarantined_;
  tracked_.erase(id);
  unreported_[id] = owner;  // the caller that gets this DATA_LOSS erases it (TakeQuarantined)
  return absl::DataLossError(absl::StrCat("session ", EchoId(id), ": its saved state is damaged (", why,
                                          "); it was quarantined in the state store"));
}

int64_t SessionJournal::quarantined() const {
  absl::MutexLock lock(&mu_);
  return quarantined_;
}

absl::Status SessionJournal::TakeQuarantined(const std::string& id, const std::string& caller) {
  absl::MutexLock lock(&mu_);
  auto it = unreported_.find(id);
  if (it == unreported_.end() || (!it->second.empty() && it->second != caller)) return absl::OkStatus();
  unreported_.erase(it);
  return absl::DataLossError(
      absl::StrCat("session ", EchoId(id), ": its saved state was damaged and it was quarantined at start-up"));
}

void SessionJournal::Wait(WaitingSession session) {
  absl::MutexLock lock(&mu_);
  auto t = tracked_.find(session.id);
  if (t == tracked_.end() || t->second.lost) return;                   // not held here (now)
  if (session.claim != 0 && t->second.claim != session.claim) return;  // adopted again since EndWait
  std::string id = session.id;
  waiting_[std::move(id)] = std::move(session);
}

absl::Status SessionJournal::Waiting(const std::string& id, const std::string& caller,
                                     const std::function<bool(const std::string&)>& served) {
  std::string fingerprint;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiting_.find(id);
    if (it == waiting_.end() || it->second.owner != caller) return absl::OkStatus();
    if (auto t = tracked_.find(id); t != tracked_.end() && t->second.lost) {
      waiting_.erase(it);  // another replica took it over (this one paused): adopted from there
      return absl::OkStatus();
    }
    fingerprint = it->second.fingerprint;
  }
  const bool now_served = served(fingerprint);  // outside mu_: it asks the repository
  absl::MutexLock lock(&mu_);
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return absl::OkStatus();
  if (!now_served) return absl::FailedPreconditionError(it->second.why);
  waiting_.erase(it);  // still held here: adopted by this replica as a restart would
  return absl::OkStatus();
}

std::optional<SessionJournal::WaitingSession> SessionJournal::EndWait(const std::string& id,
                                                                      const std::string& caller) {
  absl::MutexLock lock(&mu_);
  auto it = waiting_.find(id);
  if (it == waiting_.end() || it->second.owner != caller) return std::nullopt;
  WaitingSession ended = std::move(it->second);
  waiting_.erase(it);
  auto t = tracked_.find(id);
  if (t == tracked_.end() || t->second.lost) return std::nullopt;  // another replica took it over
  ended.claim = t->second.claim;
  return ended;
}

std::vector<SessionJournal::WaitingSession> SessionJournal::Waiters() const {
  absl::MutexLock lock(&mu_);
  std::vector<WaitingSession> all;
  for (const auto& [id, w] : waiting_) {
    auto t = tracked_.find(id);
    if (t == tracked_.end() || !t->second.lost) all.push_back(w);  // not one another replica took over
  }
  return all;
}

int SessionJournal::ExpireWaiting(absl::Time now) {
  std::vector<std::string> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (now < it->second.expires) {
        ++it;
        continue;
      }
      auto t = tracked_.find(it->first);
      if (t != tracked_.end() && !t->second.lost) expired.push_back(it->first);
      it = waiting_.erase(it);
    }
  }
  for (const std::string& id : expired) RecordDelete(id);
  return static_cast<int>(expired.size());
}

bool SessionJournal::IsWaiting(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  return waiting_.count(id) != 0;
}

int64_t SessionJournal::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(waiting_.size());
}

absl::StatusOr<JournalRecord> SessionJournal::Load(const std::string& id) {
  if (!IsValidStateKey(id)) return absl::NotFoundError(absl::StrCat("session ", EchoId(id), " not found"));
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(id);
    if (it != tracked_.end()) {
      if (it->second.lost) return Moved(id);
      if (it->second.unresolved) {
        return absl::UnavailableError(absl::StrCat("session ", EchoId(id),
                                                   ": the outcome of its last write is not known yet (the state "
                                                   "store did not answer); retry"));
      }
      token = it->second.token;
    }
  }
  auto meta_bytes = backend_->Get(Key(id, "meta"));
  if (absl::IsNotFound(meta_bytes.status()))
    return absl::NotFoundError(absl::StrCat("session ", EchoId(id), " not found"));
  if (!meta_bytes.ok()) return absl::UnavailableError(meta_bytes.status().message());
  JournalRecord record;
  auto meta = DecodeSessionMeta(*meta_bytes);
  if (!meta.ok()) return QuarantineSession(id, std::string(meta.status().message()));
  if (meta->id != id) return QuarantineSession(id, "its meta names another session");
  record.meta = *std::move(meta);
  auto snap = backend_->Get(Key(id, "snap"));
  if (!snap.ok() && !absl::IsNotFound(snap.status())) return absl::UnavailableError(snap.status().message());
  if (!snap.ok()) return QuarantineSession(id, "its snapshot is missing", record.meta.owner);
  auto image = DecodeSessionExport(*snap);
  if (!image.ok())
    return QuarantineSession(id, absl::StrCat("snapshot: ", image.status().message()), record.meta.owner);
  record.image = *std::move(image);
  auto log = backend_->Get(Key(id, "log"));
  if (!log.ok() && !absl::IsNotFound(log.status())) return absl::UnavailableError(log.status().message());
  size_t valid = 0;
  if (log.ok()) {
    if (auto s = ReplayJournalLog(*log, &record, &valid); !s.ok())
      return QuarantineSession(id, std::string(s.message()), record.meta.owner);
    if (valid < log->size() && !token.empty()) {
      // A record a crash cut short: never acknowledged. Cut it off before
      // anything is appended after it.
      TXL_LOG(WARNING) << "session " << id << ": a log record cut short by a crash (" << log->size() - valid
                       << " bytes) was dropped";
      const auto [cut, outcome] =
          WriteOne(backend_.get(), {"trim",
                                    {{StoreGuard::kOneOf, Key(id, "holder"), {token}},
                                     {StoreGuard::kLength, Key(id, "log"), {}, static_cast<int64_t>(log->size())}},
                                    {{StoreMutation::kPut, Key(id, "log"), log->substr(0, valid)}}});
      if (!cut.ok()) return absl::UnavailableError(cut.message());
      if (outcome != kWriteApplied) return Moved(id);
    }
  }
  absl::MutexLock lock(&mu_);
  auto it = tracked_.find(id);
  if (it != tracked_.end() && it->second.token == token && !token.empty()) {
    it->second.durable = record.position();  // what the history goes on from
    it->second.snapshot_at = record.image.position;
    it->second.log_bytes = static_cast<int64_t>(valid);
  }
  return record;
}

absl::StatusOr<std::vector<std::string>> SessionJournal::Held() {
  ASSIGN_OR_RETURN(const std::vector<std::string> keys, backend_->List("sessions/"));
  std::vector<std::string> ids;
  for (const std::string& key : keys) {
    constexpr absl::string_view kSuffix = "/holder";
    if (!absl::StartsWith(key, "sessions/") || !absl::EndsWith(key, kSuffix) || key.size() <= kSuffix.size() + 9)
      continue;
    auto holder = backend_->Get(key);
    if (holder.ok() && HolderReplica(*holder) == config_.replica)
      ids.push_back(key.substr(9, key.size() - 9 - kSuffix.size()));
  }
  return ids;
}

absl::StatusOr<JournalRecord> SessionJournal::Claim(const std::string& id, const std::optional<std::string>& current) {
  const std::string token = NewToken();
  auto claimed = backend_->CompareAndSet(Key(id, "holder"), current, token);
  if (!claimed.ok()) return absl::UnavailableError(claimed.status().message());
  if (!*claimed)
    return absl::UnavailableError(absl::StrCat("session ", EchoId(id), " was just taken over by another replica"));
  {
    absl::MutexLock lock(&mu_);
    Tracked& t = tracked_[id] = Tracked();
    t.token = token;
    t.claim = ++claims_;
    waiting_.erase(id);  // claimed to be served: whatever it waited for is over
  }
  absl::StatusOr<JournalRecord> record = Load(id);
  if (!record.ok() && !absl::IsDataLoss(record.status())) {
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(id);
    if (it != tracked_.end() && it->second.token == token) tracked_.erase(it);  // held, but not served from here yet
  }
  return record;
}

absl::StatusOr<JournalRecord> SessionJournal::Recover(const std::string& id) {
  auto holder = backend_->Get(Key(id, "holder"));
  if (!holder.ok()) return holder.status();
  if (HolderReplica(*holder) != config_.replica)
    return absl::UnavailableError(absl::StrCat("session ", EchoId(id), " is held by another replica"));
  return Claim(id, *holder);
}

absl::StatusOr<JournalRecord> SessionJournal::Adopt(const std::string& id, const std::string& caller) {
  const auto not_found = [&] { return absl::NotFoundError(absl::StrCat("session ", EchoId(id), " not found")); };
  if (!IsValidStateKey(id) || id.find('/') != std::string::npos) return not_found();
  auto meta = backend_->Get(Key(id, "meta"));
  if (absl::IsNotFound(meta.status())) return not_found();
  if (!meta.ok()) return absl::UnavailableError(meta.status().message());
  // Another principal's session answers like none at all, before anything
  // could tell that it exists.
  auto decoded = DecodeSessionMeta(*meta);
  if (decoded.ok() && decoded->owner != caller) return not_found();
  auto holder = backend_->Get(Key(id, "holder"));
  std::optional<std::string> current;
  if (holder.ok()) {
    current = *holder;
  } else if (!absl::IsNotFound(holder.status())) {
    return absl::UnavailableError(holder.status().message());
  }
  if (current && HolderReplica(*current) != config_.replica) {
    const std::string other = HolderReplica(*current);
    auto beat = backend_->Get(absl::StrCat("replicas/", other));
    int64_t nanos = 0;
    if (beat.ok() && absl::SimpleAtoi(*beat, &nanos) &&
        absl::Now() - absl::FromUnixNanos(nanos) < config_.holder_timeout) {
      // Ask the holder to hand it over: the proxy routes the session here now.
      (void)backend_->Put(WantedKey(other, id), absl::StrCat(config_.replica, " ", *current));
      return absl::UnavailableError(absl::StrCat("session ", EchoId(id), " is served by replica ", other,
                                                 ", which was asked to hand it over; retry shortly"));
    }
  }
  // Claimed with a new token, also when the holder names this replica: a
  // claim whose reply was lost, or an earlier run of it.
  auto record = Claim(id, current);
  if (absl::IsDataLoss(record.status())) (void)TakeQuarantined(id, caller);  // the caller is told now
  return record;
}

}  // namespace txl
