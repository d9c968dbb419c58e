// SessionJournal's writer thread: WriterLoop takes what is queued, Apply
// checks each op against the stored session and sends the writes as one
// group commit (Send), and Answer tells each op's caller its outcome once
// written. Writes whose outcome is unknown are resolved in session_journal_resolve.cc.
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/echo_id.h"
#include "base/log.h"
#include "server/durability/session_journal.h"
#include "server/durability/session_journal_internal.h"

namespace txl {
namespace {

// A failure that wrote nothing is told as UNAVAILABLE, whatever code it had.
absl::Status NotWritten(const absl::Status& s) { return absl::IsUnknown(s) ? absl::UnavailableError(s.message()) : s; }

}  // namespace

using session_journal_internal::EncodeLogRecord;
using session_journal_internal::Key;
using session_journal_internal::Moved;
using session_journal_internal::NotRecorded;

void SessionJournal::WriterLoop() {
  absl::Time next_heartbeat = absl::Now() + config_.heartbeat_interval;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), next_heartbeat - absl::Now());
    }
    if (absl::Now() >= next_heartbeat) {
      next_heartbeat = absl::Now() + config_.heartbeat_interval;
      absl::Status beat = Heartbeat();
      if (!beat.ok()) TXL_LOG(WARNING) << "state store heartbeat: " << beat.message();
      SetHealth(beat);  // a store that takes writes again takes sessions' writes again
      // Before the batch is taken: what a resolution puts back goes first.
      if (beat.ok()) {
        VerifyHolds();
        ResolveAll();
      }
      FindWanted();
    }
    std::vector<Op> batch;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      while (!queue_.empty()) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      stopping = stopping_;
    }
    if (!batch.empty()) {
      // Writes first, then the acknowledgements that waited for them.
      bool writes = false;
      for (const Op& op : batch) writes = writes || op.kind != Op::kAfter;
      absl::Status s = Apply(batch);
      if (writes) SetHealth(s);
      bool unresolved = false;
      for (Op& op : batch) {
        unresolved = unresolved || op.waits;
        Answer(op);
      }
      // A guard that failed or a reply that was lost: read back at once if the store answers.
      if (unresolved) ResolveAll();
      absl::MutexLock lock(&mu_);
      applied_ += static_cast<int64_t>(batch.size());
    }
    if (stopping) {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return;
    }
  }
}

absl::Status SessionJournal::Apply(std::vector<Op>& batch) {
  // The writes of a batch go to the store as one group commit, except a
  // rewind, which reads the log first. A session's writes must continue
  // what the store holds exactly (the journal's own check, then the store's
  // guards); one that does not is refused unwritten. After a failure that
  // wrote nothing, nothing more of the batch is written.
  std::vector<std::pair<Op*, StoreWrite>> group;
  std::map<std::string, std::pair<int64_t, int64_t>>
      predicted;  // per session: its end and log bytes once the group is written
  absl::Status status;
  // Ops after a failure are not sent: refused, whatever the failure was.
  auto not_sent = [&] { return absl::IsUnknown(status) ? absl::UnavailableError(status.message()) : status; };
  for (Op& op : batch) {
    if (op.kind == Op::kAfter) continue;
    if (!status.ok()) {
      op.result = not_sent();
      continue;
    }
    if (op.kind == Op::kDeleteKey) {  // a "wanted" request: nobody else writes it
      status = Send(group);
      if (status.ok()) (void)backend_->Delete(op.key);
      continue;
    }
    if (op.kind == Op::kRewind) status = Send(group);  // it reads what the group writes
    if (!status.ok()) {
      op.result = not_sent();
      continue;
    }
    WriteBasis basis;
    if (!BasisFor(op, &basis)) continue;
    auto p = predicted.find(op.session);
    const int64_t have = p != predicted.end() ? p->second.first : basis.durable;
    const int64_t bytes = p != predicted.end() ? p->second.second : basis.log_bytes;
    if (absl::Status in_step = InStep(op, have); !in_step.ok()) {
      op.result = in_step;
      continue;
    }
    StoreWrite w = WriteOf(op, basis.token, bytes);
    if (op.kind == Op::kRewind) {
      bool ready = false;
      status = AddRewindCut(op, bytes, basis.snapshot_at, &w, &ready);
      if (!ready) continue;
      group.emplace_back(&op, std::move(w));
      status = Send(group);
      continue;
    }
    if (op.kind == Op::kAppend)
      predicted[op.session] = {op.end, bytes + static_cast<int64_t>(w.mutations[0].value.size())};
    if (op.kind == Op::kCreate) predicted[op.session] = {op.end, static_cast<int64_t>(op.log.size())};
    group.emplace_back(&op, std::move(w));
  }
  if (status.ok()) status = Send(group);
  return status;
}

bool SessionJournal::BasisFor(Op& op, WriteBasis* basis) {
  // What the op is written against: this replica's token, and the stored session as it knows it.
  absl::MutexLock lock(&mu_);
  auto it = tracked_.find(op.session);
  if (op.kind == Op::kCreate) {
    if (it != tracked_.end() && !it->second.lost) {
      op.result = absl::AlreadyExistsError(absl::StrCat("session_id: ", EchoId(op.session), " already exists"));
      return false;
    }
    tracked_[op.session] = Tracked();
    tracked_[op.session].token = basis->token = op.token;
    tracked_[op.session].claim = ++claims_;
  } else if (it == tracked_.end()) {
    op.result = absl::UnavailableError(
        absl::StrCat("session ", EchoId(op.session), " is not held by this replica in the state store"));
    return false;
  } else if (it->second.lost) {
    op.result = Moved(op.session);
    return false;
  } else if (op.kind == Op::kRelease && op.claim != it->second.claim) {
    return false;  // claimed again since it was queued (an adoption): the new claim stays
  } else if (it->second.unresolved) {
    op.waits = op.held_back = true;  // nothing more is written until what landed is known
    return false;
  } else {
    basis->token = it->second.token;
    basis->durable = it->second.durable;
    basis->log_bytes = it->second.log_bytes;
    basis->snapshot_at = it->second.snapshot_at;
  }
  return true;
}

absl::Status SessionJournal::InStep(const Op& op, int64_t have) {
  auto out_of_step = [&] {
    return absl::UnavailableError(absl::StrCat("session ", EchoId(op.session), ": history from position ",
                                               op.start >= 0 ? op.start : op.end, " not written: the state store has ",
                                               have, " tokens of it (an earlier write failed)"));
  };
  if (op.kind == Op::kAppend && (op.start > have || op.end <= have)) {  // a gap, or nothing new
    return out_of_step();
  }
  if (op.kind == Op::kSnapshot && have != op.end) {
    return out_of_step();  // a snapshot holding history the store never acknowledged
  }
  if (op.kind == Op::kRewind && op.end > have) {
    return out_of_step();  // past what the store holds
  }
  return absl::OkStatus();
}

absl::Status SessionJournal::AddRewindCut(Op& op, int64_t bytes, int64_t snapshot_at, StoreWrite* w, bool* ready) {
  // The new log is the stored one cut at the position; the snapshot is
  // written too if the stored one is later (with the old log it
  // replays to the old history: a crash between the two is harmless).
  absl::StatusOr<std::string> log = backend_->Get(Key(op.session, "log"));
  if (absl::IsNotFound(log.status())) log = std::string();
  if (!log.ok()) {
    op.result = log.status();
    return log.status();
  }
  if (static_cast<int64_t>(log->size()) != bytes) {
    absl::MutexLock lock(&mu_);
    tracked_[op.session].unresolved = true;  // not the log this replica wrote: read back what is there
    op.waits = op.held_back = true;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> cut = TruncateJournalLog(*log, op.end);
  if (!cut.ok()) {  // the stored log is damaged or short: refused, not a store failure
    op.result = cut.status();
    return absl::OkStatus();
  }
  op.log_bytes = cut->size();
  if (op.replace_snapshot || snapshot_at < 0 || snapshot_at > op.end)
    w->mutations.push_back({StoreMutation::kPut, Key(op.session, "snap"), op.snapshot});
  w->mutations.push_back({StoreMutation::kPut, Key(op.session, "log"), *std::move(cut)});
  if (!op.meta.empty()) w->mutations.push_back({StoreMutation::kPut, Key(op.session, "meta"), op.meta});
  *ready = true;
  return absl::OkStatus();
}

StoreWrite SessionJournal::WriteOf(const Op& op, const std::string& token, int64_t bytes) const {
  StoreWrite w;
  const std::string& id = op.session;
  const StoreGuard held{StoreGuard::kOneOf, Key(id, "holder"), {token}};
  const StoreGuard log_length{StoreGuard::kLength, Key(id, "log"), {}, bytes};
  switch (op.kind) {
    case Op::kAppend:
      w.label = "append";
      w.guards = {held, log_length};
      w.mutations = {{StoreMutation::kAppend, Key(id, "log"), EncodeLogRecord(op.start, op.tokens)}};
      break;
    case Op::kRewind:  // its mutations follow from the log it reads (Apply)
      w.label = "rewind";
      w.guards = {held, log_length};
      break;
    case Op::kSnapshot:
      w.label = "snapshot";
      w.guards = {held, log_length};
      w.mutations = {{StoreMutation::kPut, Key(id, "snap"), op.snapshot}};
      break;
    case Op::kCreate:
      // The meta last: the directory store applies in order, and a session
      // without its meta does not exist.
      w.label = op.log.empty() ? "create" : "fork";
      w.guards = {{StoreGuard::kAbsent, Key(id, "meta")}};
      w.mutations = {{StoreMutation::kPut, Key(id, "log"), op.log},
                     {StoreMutation::kPut, Key(id, "snap"), op.snapshot},
                     {StoreMutation::kPut, Key(id, "holder"), op.token},
                     {StoreMutation::kPut, Key(id, "meta"), op.meta}};
      break;
    case Op::kDelete:
      w.label = "delete";  // the meta first: without it the session is gone
      w.guards = {held};
      for (const char* part : {"meta", "snap", "log", "holder"})
        w.mutations.push_back({StoreMutation::kDelete, Key(id, part)});
      break;
    case Op::kRelease:
      w.label = "release";
      w.guards = {held};
      w.mutations = {{StoreMutation::kDelete, Key(id, "holder")}};
      break;
    default: break;
  }
  return w;
}

absl::Status SessionJournal::Send(std::vector<std::pair<Op*, StoreWrite>>& group) {
  if (group.empty()) return absl::OkStatus();
  std::vector<StoreWrite> writes;
  for (auto& [op, w] : group) writes.push_back(std::move(w));
  std::vector<int> outcomes;
  const absl::Status status = backend_->Write(writes, &outcomes);
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < group.size(); ++i) {
    Op& op = *group[i].first;
    const int failed = i < outcomes.size() ? outcomes[i] : kWriteNotApplied;
    if (failed == kWriteNotApplied) {
      op.result = NotWritten(status);  // nothing of it was written
      if (op.kind == Op::kCreate) tracked_.erase(op.session);
      continue;
    }
    if (op.kind == Op::kRelease) {
      auto now = tracked_.find(op.session);
      if (now == tracked_.end() || now->second.claim != op.claim) continue;  // claimed again while it was written
    }
    Tracked& t = tracked_[op.session];
    if (failed == kWriteUnknown) {  // it may have landed, or may land later
      op.waits = true;
      t.unresolved = true;
      if (op.kind == Op::kAppend) t.sent.emplace_back(op.start, op.tokens);
      t.create = t.create || op.kind == Op::kCreate;
      t.remove = t.remove || op.kind == Op::kDelete;
      t.release = t.release || op.kind == Op::kRelease;
      if (op.kind == Op::kSnapshot) t.snapshot_at = -1;
      continue;
    }
    if (failed == kWriteApplied) {
      switch (op.kind) {
        case Op::kAppend:
          t.durable = op.end;
          t.log_bytes += static_cast<int64_t>(writes[i].mutations[0].value.size());
          break;
        case Op::kSnapshot: t.snapshot_at = op.end; break;
        case Op::kCreate:
          t.durable = t.snapshot_at = op.end;
          t.log_bytes = static_cast<int64_t>(op.log.size());
          t.create = false;
          break;
        case Op::kRewind:
          t.durable = op.end;
          t.log_bytes = static_cast<int64_t>(op.log_bytes);
          if (writes[i].mutations.size() > 1) t.snapshot_at = op.end;
          break;
        case Op::kDelete:
        case Op::kRelease: tracked_.erase(op.session); break;
        default: break;
      }
      continue;
    }
    if (op.kind == Op::kCreate) {
      tracked_.erase(op.session);
      op.result = absl::AlreadyExistsError(absl::StrCat("session_id: ", EchoId(op.session), " already exists"));
    } else if (failed == 0) {  // the holder: another replica took it over
      if (!t.lost) TXL_LOG(WARNING) << "session " << op.session << ": another replica holds it now";
      if (!t.lost) newly_lost_.push_back(op.session);
      t.lost = true;
      op.result = Moved(op.session);
    } else {  // the log is not what this replica wrote: read back what is there
      op.waits = true;
      t.unresolved = true;
    }
  }
  group.clear();
  return status;
}

void SessionJournal::Answer(Op& op) {
  if (op.durable_done || op.waits) {
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(op.session);
    if (it != tracked_.end() && it->second.unresolved && (op.durable_done || op.done || op.held_back)) {
      it->second.waiting.push_back(std::move(op));  // answered (or sent) once what landed is known
      return;
    }
  }
  if (op.durable_done) {
    int64_t have = 0;
    absl::Status error;
    bool lost = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = tracked_.find(op.session);
      have = DurableLocked(op.session);
      lost = it != tracked_.end() && it->second.lost;
      error = error_;
    }
    if (!lost && have >= op.end) {
      op.durable_done(absl::OkStatus(), op.end);
    } else if (have < 0) {  // a session this replica does not hold (any more): nothing of it is written here
      op.durable_done(absl::UnavailableError(absl::StrCat("session ", EchoId(op.session),
                                                          " is not held by this replica in the state store; retry")),
                      op.end);
    } else {
      op.durable_done(lost ? Moved(op.session) : !error.ok() ? error : NotRecorded(op.session, have), have);
    }
  } else if (op.done) {
    if (op.held_back && op.result.ok()) op.result = absl::UnavailableError("not written");
    op.done(op.result);
  }
}

void SessionJournal::SetHealth(const absl::Status& write) {
  absl::MutexLock lock(&mu_);
  if (write.ok()) {
    if (!error_.ok()) TXL_LOG(INFO) << "the session state store is writable again";
    error_ = absl::OkStatus();
    return;
  }
  if (error_.ok()) {
    TXL_LOG(ERROR) << "the session state store failed (" << backend_->Describe() << "): " << write.message()
                   << "; journaled sessions are read-only until it recovers";
  }
  error_ = absl::UnavailableError(absl::StrCat("the session state store cannot be written (", backend_->Describe(),
                                               "): ", write.message(),
                                               "; journaled sessions are read-only until it recovers"));
}
}  // namespace txl
