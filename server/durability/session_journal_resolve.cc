// SessionJournal's unknown outcomes (see session_journal.h): Resolve
// re-fences a session whose write's outcome was lost, reads back what
// landed, and answers or re-sends what waited for it; ResolveAll does so for
// every such session, on the writer thread.
#include <algorithm>
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
using session_journal_internal::NotRecorded;
using session_journal_internal::ParseLog;
using session_journal_internal::WriteOne;

namespace {

// What the store holds of a session, read back by Resolve.
struct Stored {
  absl::StatusOr<std::string> log;
  // The history the store holds.
  int64_t start = -1;
  std::vector<int> history;
  size_t valid = 0;
  int64_t end = 0;       // the history's end, or the snapshot's if later
  int64_t snap_at = -1;  // the snapshot's position (-1: none that reads)
  bool gone = false;     // no meta: the session is gone
};

absl::StatusOr<Stored> ReadStored(StateBackend* backend, const std::string& id) {
  Stored s;
  auto meta = backend->Get(Key(id, "meta"));
  auto snap = backend->Get(Key(id, "snap"));
  s.log = backend->Get(Key(id, "log"));
  for (const auto* read : {&meta, &snap, &s.log}) {
    if (!read->ok() && !absl::IsNotFound(read->status())) return read->status();
  }
  if (s.log.ok() && !ParseLog(*s.log, &s.start, &s.history, &s.valid).ok()) s.history.clear();
  s.end = s.start < 0 ? 0 : s.start + static_cast<int64_t>(s.history.size());
  if (snap.ok()) {
    if (auto p = SessionExportPosition(*snap); p.ok()) s.snap_at = *p;
  }
  s.end = std::max(s.end, s.snap_at);
  s.gone = !meta.ok();
  return s;
}

// How far the store's history is this replica's: what was acknowledged
// (`durable`), then each append sent since whose tokens are there, in order.
int64_t Covered(int64_t durable, const std::vector<std::pair<int64_t, std::vector<int>>>& sent, const Stored& s) {
  int64_t covered = durable;
  for (const auto& [at, tokens] : sent) {
    if (at > covered || s.start < 0) break;
    bool there = true;
    for (size_t i = 0; i < tokens.size() && there; ++i) {
      const int64_t k = at + static_cast<int64_t>(i) - s.start;
      there = k >= 0 && k < static_cast<int64_t>(s.history.size()) && s.history[k] == tokens[i];
    }
    if (!there) break;
    covered = std::max(covered, at + static_cast<int64_t>(tokens.size()));
  }
  return covered;
}

// For a session this replica still holds (under `token`): cuts off a torn
// log tail, or removes what a delete or a create left without its meta.
absl::Status Tidy(StateBackend* backend, const std::string& id, const std::string& token, const Stored& s) {
  if (!s.gone && s.valid < (s.log.ok() ? s.log->size() : 0)) {
    // A torn tail (a crash mid-append): never acknowledged; cut it off.
    const absl::Status cut =
        WriteOne(backend, {"trim",
                           {{StoreGuard::kOneOf, Key(id, "holder"), {token}},
                            {StoreGuard::kLength, Key(id, "log"), {}, static_cast<int64_t>(s.log->size())}},
                           {{StoreMutation::kPut, Key(id, "log"), s.log->substr(0, s.valid)}}})
            .first;
    if (!cut.ok()) return cut;
  }
  if (s.gone) {  // a delete that stopped after its meta, or a create that never got to it
    const absl::Status cleared = WriteOne(backend, {"delete",
                                                    {{StoreGuard::kOneOf, Key(id, "holder"), {token}}},
                                                    {{StoreMutation::kDelete, Key(id, "snap")},
                                                     {StoreMutation::kDelete, Key(id, "log")},
                                                     {StoreMutation::kDelete, Key(id, "holder")}}})
                                     .first;
    if (!cleared.ok()) return cleared;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SessionJournal::Resolve(const std::string& id) {
  Tracked t;
  {
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(id);
    if (it == tracked_.end() || !it->second.unresolved) return absl::OkStatus();
    std::vector<Op> waiting;  // not copied: they stay where they are until decided
    waiting.swap(it->second.waiting);
    t = it->second;
    it->second.waiting.swap(waiting);
  }
  std::string token;
  bool held = false;
  RETURN_IF_ERROR(Refence(id, t, &token, &held));
  ASSIGN_OR_RETURN(const Stored stored, ReadStored(backend_.get(), id));
  const bool gone = stored.gone;
  const int64_t end = stored.end;
  const int64_t covered = Covered(t.durable, t.sent, stored);
  if (held) RETURN_IF_ERROR(Tidy(backend_.get(), id, token, stored));
  // Decided: answer what waited.
  std::vector<Op> waiting;
  {
    absl::MutexLock lock(&mu_);
    Tracked& now = tracked_[id];
    waiting.swap(now.waiting);
    if ((gone && (t.remove || t.create)) || (!held && (t.release || t.create))) {
      tracked_.erase(id);  // deleted, released, or never created by this replica: its copy goes too
    } else if (gone) {     // deleted by another replica that took it over
      now.lost = true;
      now.unresolved = false;
      newly_lost_.push_back(id);
    } else if (!held) {
      now.lost = true;
      newly_lost_.push_back(id);
      now.unresolved = false;
    } else {
      now.durable = end;
      now.snapshot_at = stored.snap_at;
      now.log_bytes = static_cast<int64_t>(stored.valid);
      now.unresolved = false;
      now.verified = true;
      now.sent.clear();
      now.create = now.remove = now.release = false;
    }
  }
  TXL_LOG(WARNING) << "session " << id << ": a write's outcome was unknown; the state store holds position " << end
                   << (gone ? " (the session is gone)" : "") << (held ? "" : " under another replica")
                   << "; its waiting answers follow that";
  if (held && t.release) QueueRelease(id, t.claim);  // it did not land: again (the claim re-fenced, not a new one)
  // Still held: the appends sent that did not land are sent again, then
  // what waited goes through the writer again, in order.
  std::vector<Op> again;
  if (held && !gone) {
    for (auto& [at, tokens] : t.sent) {
      if (at + static_cast<int64_t>(tokens.size()) <= end) continue;
      Op op{Op::kAppend};
      op.session = id;
      op.start = at;
      op.end = at + static_cast<int64_t>(tokens.size());
      op.tokens = std::move(tokens);
      again.push_back(std::move(op));
    }
  }
  for (Op& op : waiting) {
    op.waits = false;
    if (held && !gone && (op.held_back || op.durable_done)) {
      op.held_back = false;
      again.push_back(std::move(op));
      continue;
    }
    AnswerResolved(id, op, held, gone, end, covered);
  }
  if (!again.empty()) {
    absl::MutexLock lock(&mu_);
    for (auto op = again.rbegin(); op != again.rend(); ++op) queue_.push_front(std::move(*op));
    enqueued_ += static_cast<int64_t>(again.size());
  }
  return absl::OkStatus();
}

absl::Status SessionJournal::Refence(const std::string& id, const Tracked& t, std::string* token, bool* held) {
  // Re-fence first: once the holder has a new token, nothing sent under an
  // old one can land, so what is read next is final. (A store whose writes
  // cannot land after their call returned, the directory, needs no new
  // token: reading is enough, and works on a full disk too.)
  std::vector<std::string> ours = t.maybe;
  ours.push_back(t.token);
  if (backend_->AppliesLate()) {
    *token = NewToken();
    const auto [fence, fenced] = WriteOne(backend_.get(), {"refence",
                                                           {{StoreGuard::kOneOf, Key(id, "holder"), ours}},
                                                           {{StoreMutation::kPut, Key(id, "holder"), *token}}});
    if (!fence.ok()) {
      absl::MutexLock lock(&mu_);
      if (fenced == kWriteUnknown) tracked_[id].maybe.push_back(*token);
      return fence;
    }
    *held = fenced == kWriteApplied;
  } else {
    auto holder = backend_->Get(Key(id, "holder"));
    if (!holder.ok() && !absl::IsNotFound(holder.status())) return holder.status();
    *held = holder.ok() && std::find(ours.begin(), ours.end(), *holder) != ours.end();
    if (*held) *token = *holder;
  }
  {
    absl::MutexLock lock(&mu_);
    Tracked& now = tracked_[id];
    if (*held) {
      now.token = *token;
      now.maybe.clear();
    }
  }
  return absl::OkStatus();
}

void SessionJournal::AnswerResolved(const std::string& id, Op& op, bool held, bool gone, int64_t end, int64_t covered) {
  if (op.durable_done) {
    const bool landed = !gone && op.end <= covered;
    if (landed) {
      op.durable_done(absl::OkStatus(), op.end);
    } else {
      op.durable_done(!held && !gone ? Moved(id) : NotRecorded(id, end), end);
    }
    return;
  }
  if (!op.done) return;
  absl::Status result = op.result;
  if (op.held_back) {
    result = !held && !gone ? Moved(id) : absl::UnavailableError(absl::StrCat("session ", EchoId(id), ": not written"));
  } else if (op.kind == Op::kCreate) {
    result = held && !gone ? absl::OkStatus()
                           : absl::UnavailableError(
                                 absl::StrCat("session ", EchoId(id), ": the state store did not record its creation"));
  } else if (op.kind == Op::kDelete) {
    result = gone ? absl::OkStatus()
                  : absl::UnavailableError(
                        absl::StrCat("session ", EchoId(id), ": the state store did not record its deletion"));
  } else if (op.kind == Op::kRewind) {
    bool landed = held && !gone && end == op.end;
    if (landed && op.replace_snapshot) {  // a migration leaves the log as it was: only the snapshot tells
      absl::StatusOr<std::string> snap = backend_->Get(Key(id, "snap"));
      landed = snap.ok() && *snap == op.snapshot;
    }
    result = landed ? absl::OkStatus()
                    : (!held && !gone ? Moved(id)
                                      : absl::UnavailableError(absl::StrCat(
                                            "session ", EchoId(id), ": the state store did not record the rewind")));
  }
  op.done(result);
}

void SessionJournal::ResolveAll() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, t] : tracked_) {
      if (t.unresolved) ids.push_back(id);
    }
  }
  for (const std::string& id : ids) {
    absl::Status s = Resolve(id);
    if (!s.ok()) {
      TXL_LOG(WARNING) << "session " << id << ": cannot read back a write's outcome yet: " << s.message();
      return;  // the store does not answer: at the next heartbeat
    }
  }
}

}  // namespace txl
