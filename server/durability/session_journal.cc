#include "server/durability/session_journal.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/byte_io.h"
#include "base/echo_id.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/status_macros.h"

namespace txl {
namespace {

constexpr char kMetaMagic[8] = {'T', 'X', 'L', 'M', 'E', 'T', 'A', '1'};

std::string Key(const std::string& id, const char* part) { return absl::StrCat("sessions/", id, "/", part); }
// A request to `holder` to hand session `id` over (kept under the holder's
// name, so each replica lists only its own).
std::string WantedKey(const std::string& holder, const std::string& id) {
  return absl::StrCat("wanted/", holder, "/", id);
}

// The replica a holder value names ("<replica>#<nonce>"; older stores: the name alone).
std::string HolderReplica(const std::string& holder) { return holder.substr(0, holder.find('#')); }

absl::Status Moved(const std::string& id) {
  return absl::UnavailableError(absl::StrCat("session ", EchoId(id),
                                             " is served by another replica now (it took the session over while "
                                             "this one was paused or cut off); retry"));
}

// One guarded write: the call's status and the write's outcome (kWriteApplied, ...).
std::pair<absl::Status, int> WriteOne(StateBackend* backend, StoreWrite write) {
  std::vector<int> outcomes;
  absl::Status s = backend->Write({std::move(write)}, &outcomes);
  return {s, outcomes.empty() ? kWriteNotApplied : outcomes[0]};
}

// An answer refused because the session's history is not written up to it.
absl::Status NotRecorded(const std::string& id, int64_t have) {
  return absl::UnavailableError(absl::StrCat("the session state store did not record the history of session ",
                                             EchoId(id), " past position ", have));
}

// A failure that wrote nothing is told as UNAVAILABLE, whatever code it had.
absl::Status NotWritten(const absl::Status& s) { return absl::IsUnknown(s) ? absl::UnavailableError(s.message()) : s; }

std::string EncodeLogRecord(int64_t start, const std::vector<int>& tokens) {
  std::string out;
  PutLE<uint32_t>(&out, static_cast<uint32_t>(tokens.size()));
  PutLE<int64_t>(&out, start);
  // The header's own checksum tells a damaged length (DATA_LOSS) from a
  // record a crash cut short (a torn tail, ignored).
  PutLE<uint64_t>(&out, Hash64(out.data(), out.size()));
  for (int t : tokens) PutLE<int32_t>(&out, t);
  PutLE<uint64_t>(&out, Hash64(out.data(), out.size()));
  return out;
}

// The log's own history: records must continue it (an overlap adds only
// what is new); a torn last record was never acknowledged (acknowledgements
// wait for the whole write).
absl::Status ParseLog(const std::string& log, int64_t* start, std::vector<int>* history, size_t* valid_bytes) {
  constexpr size_t kHeader = 4 + 8 + 8;
  ByteReader r(log);
  if (valid_bytes) *valid_bytes = 0;
  *start = -1;
  history->clear();
  while (r.left() > 0) {
    const size_t begin = r.at();
    if (r.left() < kHeader) return absl::OkStatus();  // torn tail
    uint32_t n = 0;
    int64_t at = 0;
    uint64_t header_sum = 0;
    r.Get(&n);
    r.Get(&at);
    r.Get(&header_sum);
    if (header_sum != Hash64(log.data() + begin, 12))
      return absl::DataLossError(absl::StrCat("log record at byte ", begin, ": its header fails its checksum"));
    if (r.left() < uint64_t{n} * 4 + 8) return absl::OkStatus();  // torn tail
    std::vector<int> tokens(n);
    for (uint32_t i = 0; i < n; ++i) {
      int32_t t = 0;
      r.Get(&t);
      tokens[i] = t;
    }
    const size_t body = r.at() - begin;
    uint64_t sum = 0;
    r.Get(&sum);
    if (sum != Hash64(log.data() + begin, body))
      return absl::DataLossError(absl::StrCat("log record at byte ", begin, " fails its checksum"));
    // Damage that a checksum can miss (a log that was written that way):
    // a negative start, or one whose record would run past the int64 range.
    if (at < 0 || at > std::numeric_limits<int64_t>::max() - int64_t{n})
      return absl::DataLossError(absl::StrCat("log record at byte ", begin, " starts at position ", at));
    if (*start < 0) *start = at;
    const int64_t have = *start + static_cast<int64_t>(history->size());
    if (at > have || at < *start) {
      return absl::DataLossError(
          absl::StrCat("log record at byte ", begin, " starts at position ", at, " but the history ends at ", have));
    }
    for (uint32_t i = 0; i < n; ++i) {
      if (at + static_cast<int64_t>(i) >= have) history->push_back(tokens[i]);
    }
    if (valid_bytes) *valid_bytes = r.at();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReplayJournalLog(const std::string& log, JournalRecord* record, size_t* valid_bytes) {
  int64_t start = 0;
  std::vector<int> history;
  RETURN_IF_ERROR(ParseLog(log, &start, &history, valid_bytes));
  record->tail.clear();
  record->earlier.clear();
  if (history.empty()) return absl::OkStatus();
  const int64_t snap = record->image.position;
  const int64_t end = start + static_cast<int64_t>(history.size());
  if (start > snap) {
    return absl::DataLossError(absl::StrCat("the log starts at position ", start, " but the snapshot ends at ", snap));
  }
  if (end < snap) return absl::OkStatus();  // older than the snapshot: nothing to replay, no usable history
  record->earlier.assign(history.begin(), history.begin() + (snap - start));
  record->tail.assign(history.begin() + (snap - start), history.end());
  return absl::OkStatus();
}

absl::StatusOr<std::string> TruncateJournalLog(const std::string& log, int64_t position) {
  int64_t start = 0;
  std::vector<int> history;
  RETURN_IF_ERROR(ParseLog(log, &start, &history, nullptr));
  if (history.empty() || position <= start) return std::string();
  const int64_t end = start + static_cast<int64_t>(history.size());
  if (position > end)
    return absl::OutOfRangeError(absl::StrCat("the log ends at position ", end, ", before ", position));
  history.resize(static_cast<size_t>(position - start));
  return EncodeLogRecord(start, history);
}

std::string EncodeSessionMeta(const SessionMeta& m) {
  std::string out(kMetaMagic, sizeof(kMetaMagic));
  PutString(&out, m.id);
  PutString(&out, m.owner);
  PutLE<int64_t>(&out, m.mem_len);
  PutLE<int64_t>(&out, absl::ToInt64Seconds(m.idle_ttl));
  PutLE<int64_t>(&out, absl::ToUnixNanos(m.created));
  PutLE<uint32_t>(&out, static_cast<uint32_t>(m.labels.size()));
  for (const auto& [k, v] : m.labels) {
    PutString(&out, k);
    PutString(&out, v);
  }
  PutLE<uint64_t>(&out, Hash64(out.data(), out.size()));
  return out;
}

absl::StatusOr<SessionMeta> DecodeSessionMeta(const std::string& bytes) {
  const auto damaged = [] { return absl::DataLossError("session meta: truncated or damaged"); };
  if (bytes.size() < sizeof(kMetaMagic) + 8 ||
      bytes.compare(0, sizeof(kMetaMagic), kMetaMagic, sizeof(kMetaMagic)) != 0)
    return damaged();
  ByteReader r(absl::string_view(bytes).substr(sizeof(kMetaMagic)));
  SessionMeta m;
  int64_t ttl = 0, created = 0;
  uint32_t n_labels = 0;
  if (!r.String(&m.id) || !r.String(&m.owner) || !r.Get(&m.mem_len) || !r.Get(&ttl) || !r.Get(&created) ||
      !r.Get(&n_labels))
    return damaged();
  for (uint32_t i = 0; i < n_labels; ++i) {
    std::string k, v;
    if (!r.String(&k) || !r.String(&v)) return damaged();
    m.labels[k] = v;
  }
  const size_t body = sizeof(kMetaMagic) + r.at();
  uint64_t sum = 0;
  if (!r.Get(&sum) || r.left() != 0 || sum != Hash64(bytes.data(), body)) return damaged();
  m.idle_ttl = absl::Seconds(ttl);
  m.created = absl::FromUnixNanos(created);
  return m;
}

SessionJournal::SessionJournal(const SessionJournalConfig& config, std::unique_ptr<StateBackend> backend)
    : config_(config), backend_(std::move(backend)) {}

absl::StatusOr<std::unique_ptr<SessionJournal>> SessionJournal::Create(const SessionJournalConfig& config,
                                                                       std::unique_ptr<StateBackend> backend) {
  if (config.replica.empty() || !IsValidStateKey(config.replica) || config.replica.find('/') != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("replica_name: '", config.replica, "' must be non-empty and of [A-Za-z0-9._-]"));
  std::unique_ptr<SessionJournal> j(new SessionJournal(config, std::move(backend)));
  RETURN_IF_ERROR(j->Heartbeat());
  j->writer_ = std::thread([p = j.get()] { p->WriterLoop(); });
  return j;
}

SessionJournal::~SessionJournal() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();
  // Answers still waiting for a store that never came back.
  std::vector<std::pair<Op, int64_t>> waiting;  // and the session's durable position
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, t] : tracked_) {
      for (Op& op : t.waiting) waiting.emplace_back(std::move(op), t.durable);
      t.waiting.clear();
    }
  }
  for (auto& [op, durable] : waiting) {
    op.result = absl::UnavailableError(absl::StrCat("session ", EchoId(op.session),
                                                    ": the state store did not answer before shutdown; whether "
                                                    "the last change was recorded is unknown"));
    if (op.durable_done) op.durable_done(op.result, durable);
    if (op.done) op.done(op.result);
  }
  // A clean exit: this replica's sessions may be claimed at once, by a
  // replica that takes over or by this one when it restarts.
  (void)backend_->Delete(absl::StrCat("replicas/", config_.replica));
}

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

std::string SessionJournal::NewToken() {
  absl::MutexLock lock(&mu_);
  return absl::StrCat(config_.replica, "#", absl::Hex(absl::ToUnixNanos(absl::Now())), ".", ++nonce_);
}

void SessionJournal::Enqueue(std::vector<Op> ops) {
  absl::MutexLock lock(&mu_);
  for (Op& op : ops) queue_.push_back(std::move(op));
  enqueued_ += static_cast<int64_t>(ops.size());
}

void SessionJournal::RecordCreate(const SessionMeta& meta, std::string snapshot, Done done, int64_t history_start,
                                  std::vector<int> history) {
  Op op{Op::kCreate};
  op.session = meta.id;
  op.meta = EncodeSessionMeta(meta);
  op.done = std::move(done);
  if (!history.empty()) op.log = EncodeLogRecord(history_start, history);
  auto position = SessionExportPosition(snapshot);
  op.end = position.ok() ? *position : 0;
  op.snapshot = std::move(snapshot);
  op.token = NewToken();
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
}

void SessionJournal::RecordTokens(const std::string& id, int64_t start, std::vector<int> tokens) {
  if (tokens.empty()) return;
  Op op{Op::kAppend};
  op.session = id;
  op.start = start;
  op.end = start + static_cast<int64_t>(tokens.size());
  op.tokens = std::move(tokens);
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
}

void SessionJournal::RecordSnapshot(const std::string& id, std::string snapshot) {
  auto position = SessionExportPosition(snapshot);
  if (!position.ok()) return;  // never a snapshot nobody could read back
  Op op{Op::kSnapshot};
  op.session = id;
  op.end = *position;
  op.snapshot = std::move(snapshot);
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
}

void SessionJournal::RecordRewind(const std::string& id, int64_t position, std::string snapshot, Done done) {
  Op op{Op::kRewind};
  op.session = id;
  op.end = position;
  op.snapshot = std::move(snapshot);
  op.done = std::move(done);
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
}

void SessionJournal::RecordDelete(const std::string& id, Done done) {
  std::vector<Op> ops(2);
  ops[0].kind = Op::kDelete;
  ops[0].session = id;
  ops[0].done = std::move(done);
  ops[1].kind = Op::kDeleteKey;
  ops[1].key = WantedKey(config_.replica, id);
  Enqueue(std::move(ops));
}

void SessionJournal::RecordRelease(const std::string& id) {
  std::vector<Op> ops(2);
  ops[0].kind = Op::kDeleteKey;
  ops[0].key = WantedKey(config_.replica, id);
  ops[1].kind = Op::kRelease;
  ops[1].session = id;
  Enqueue(std::move(ops));
}

void SessionJournal::SetHandoffHandler(std::function<void(std::vector<std::string>)> handler) {
  absl::MutexLock lock(&handoff_mu_);
  handoff_ = std::move(handler);
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

void SessionJournal::After(Done fn) {
  Op op{Op::kAfter};
  op.done = std::move(fn);
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
}

void SessionJournal::AfterDurable(const std::string& id, int64_t position,
                                  std::function<void(absl::Status, int64_t)> fn) {
  Op op{Op::kAfter};
  op.session = id;
  op.end = position;
  op.durable_done = std::move(fn);
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
}

absl::Status SessionJournal::Writable() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

absl::Status SessionJournal::Flush() {
  absl::MutexLock lock(&mu_);
  const int64_t target = enqueued_;
  auto done = [this, target]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return applied_ >= target; };
  mu_.Await(absl::Condition(&done));
  return error_;
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

int64_t SessionJournal::DurableLocked(const std::string& id) const {
  auto it = tracked_.find(id);
  return it == tracked_.end() ? -1 : it->second.durable;
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
  auto out_of_step = [](const Op& op, int64_t have) {
    return absl::UnavailableError(absl::StrCat("session ", EchoId(op.session), ": history from position ",
                                               op.start >= 0 ? op.start : op.end, " not written: the state store has ",
                                               have, " tokens of it (an earlier write failed)"));
  };
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
    // What the op is written against: this replica's token, and the stored session as it knows it.
    std::string token;
    int64_t durable = 0, log_bytes = 0, snapshot_at = -1;
    {
      absl::MutexLock lock(&mu_);
      auto it = tracked_.find(op.session);
      if (op.kind == Op::kCreate) {
        if (it != tracked_.end() && !it->second.lost) {
          op.result = absl::AlreadyExistsError(absl::StrCat("session_id: ", EchoId(op.session), " already exists"));
          continue;
        }
        tracked_[op.session] = Tracked();
        tracked_[op.session].token = token = op.token;
      } else if (it == tracked_.end()) {
        op.result = absl::UnavailableError(
            absl::StrCat("session ", EchoId(op.session), " is not held by this replica in the state store"));
        continue;
      } else if (it->second.lost) {
        op.result = Moved(op.session);
        continue;
      } else if (it->second.unresolved) {
        op.waits = op.held_back = true;  // nothing more is written until what landed is known
        continue;
      } else {
        token = it->second.token;
        durable = it->second.durable;
        log_bytes = it->second.log_bytes;
        snapshot_at = it->second.snapshot_at;
      }
    }
    auto p = predicted.find(op.session);
    const int64_t have = p != predicted.end() ? p->second.first : durable;
    const int64_t bytes = p != predicted.end() ? p->second.second : log_bytes;
    if (op.kind == Op::kAppend && (op.start > have || op.end <= have)) {  // a gap, or nothing new
      op.result = out_of_step(op, have);
      continue;
    }
    if (op.kind == Op::kSnapshot && have != op.end) {
      op.result = out_of_step(op, have);  // a snapshot holding history the store never acknowledged
      continue;
    }
    if (op.kind == Op::kRewind && op.end > have) {
      op.result = out_of_step(op, have);  // past what the store holds
      continue;
    }
    StoreWrite w = WriteOf(op, token, bytes);
    if (op.kind == Op::kRewind) {
      // The new log is the stored one cut at the position; the snapshot is
      // written too if the stored one is later (with the old log it
      // replays to the old history: a crash between the two is harmless).
      absl::StatusOr<std::string> log = backend_->Get(Key(op.session, "log"));
      if (absl::IsNotFound(log.status())) log = std::string();
      if (!log.ok()) {
        status = log.status();
        op.result = status;
        continue;
      }
      if (static_cast<int64_t>(log->size()) != bytes) {
        absl::MutexLock lock(&mu_);
        tracked_[op.session].unresolved = true;  // not the log this replica wrote: read back what is there
        op.waits = op.held_back = true;
        continue;
      }
      absl::StatusOr<std::string> cut = TruncateJournalLog(*log, op.end);
      if (!cut.ok()) {  // the stored log is damaged or short: refused, not a store failure
        op.result = cut.status();
        continue;
      }
      op.log_bytes = cut->size();
      if (snapshot_at < 0 || snapshot_at > op.end)
        w.mutations.push_back({StoreMutation::kPut, Key(op.session, "snap"), op.snapshot});
      w.mutations.push_back({StoreMutation::kPut, Key(op.session, "log"), *std::move(cut)});
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
  // Re-fence first: once the holder has a new token, nothing sent under an
  // old one can land, so what is read next is final. (A store whose writes
  // cannot land after their call returned, the directory, needs no new
  // token: reading is enough, and works on a full disk too.)
  std::vector<std::string> ours = t.maybe;
  ours.push_back(t.token);
  std::string token;
  bool held = false;
  if (backend_->AppliesLate()) {
    token = NewToken();
    const auto [fence, fenced] = WriteOne(backend_.get(), {"refence",
                                                           {{StoreGuard::kOneOf, Key(id, "holder"), ours}},
                                                           {{StoreMutation::kPut, Key(id, "holder"), token}}});
    if (!fence.ok()) {
      absl::MutexLock lock(&mu_);
      if (fenced == kWriteUnknown) tracked_[id].maybe.push_back(token);
      return fence;
    }
    held = fenced == kWriteApplied;
  } else {
    auto holder = backend_->Get(Key(id, "holder"));
    if (!holder.ok() && !absl::IsNotFound(holder.status())) return holder.status();
    held = holder.ok() && std::find(ours.begin(), ours.end(), *holder) != ours.end();
    if (held) token = *holder;
  }
  {
    absl::MutexLock lock(&mu_);
    Tracked& now = tracked_[id];
    if (held) {
      now.token = token;
      now.maybe.clear();
    }
  }
  auto meta = backend_->Get(Key(id, "meta"));
  auto snap = backend_->Get(Key(id, "snap"));
  auto log = backend_->Get(Key(id, "log"));
  for (const auto* read : {&meta, &snap, &log}) {
    if (!read->ok() && !absl::IsNotFound(read->status())) return read->status();
  }
  // The history the store holds.
  int64_t start = -1;
  std::vector<int> history;
  size_t valid = 0;
  if (log.ok() && !ParseLog(*log, &start, &history, &valid).ok()) history.clear();
  int64_t end = start < 0 ? 0 : start + static_cast<int64_t>(history.size());
  int64_t snap_at = -1;
  if (snap.ok()) {
    if (auto p = SessionExportPosition(*snap); p.ok()) snap_at = *p;
  }
  end = std::max(end, snap_at);
  const bool gone = !meta.ok();
  // How far the store's history is this replica's: what was acknowledged,
  // then each append sent since whose tokens are there, in order.
  int64_t covered = t.durable;
  for (const auto& [at, tokens] : t.sent) {
    if (at > covered || start < 0) break;
    bool there = true;
    for (size_t i = 0; i < tokens.size() && there; ++i) {
      const int64_t k = at + static_cast<int64_t>(i) - start;
      there = k >= 0 && k < static_cast<int64_t>(history.size()) && history[k] == tokens[i];
    }
    if (!there) break;
    covered = std::max(covered, at + static_cast<int64_t>(tokens.size()));
  }
  if (held && !gone && valid < (log.ok() ? log->size() : 0)) {
    // A torn tail (a crash mid-append): never acknowledged; cut it off.
    const absl::Status cut =
        WriteOne(backend_.get(), {"trim",
                                  {{StoreGuard::kOneOf, Key(id, "holder"), {token}},
                                   {StoreGuard::kLength, Key(id, "log"), {}, static_cast<int64_t>(log->size())}},
                                  {{StoreMutation::kPut, Key(id, "log"), log->substr(0, valid)}}})
            .first;
    if (!cut.ok()) return cut;
  }
  if (held && gone) {  // a delete that stopped after its meta, or a create that never got to it
    const absl::Status cleared = WriteOne(backend_.get(), {"delete",
                                                           {{StoreGuard::kOneOf, Key(id, "holder"), {token}}},
                                                           {{StoreMutation::kDelete, Key(id, "snap")},
                                                            {StoreMutation::kDelete, Key(id, "log")},
                                                            {StoreMutation::kDelete, Key(id, "holder")}}})
                                     .first;
    if (!cleared.ok()) return cleared;
  }
  // Decided: answer what waited.
  std::vector<Op> waiting;
  int64_t durable = 0;
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
      now.snapshot_at = snap_at;
      now.log_bytes = static_cast<int64_t>(valid);
      now.unresolved = false;
      now.verified = true;
      now.sent.clear();
      now.create = now.remove = now.release = false;
    }
    durable = end;
  }
  TXL_LOG(WARNING) << "session " << id << ": a write's outcome was unknown; the state store holds position " << end
                   << (gone ? " (the session is gone)" : "") << (held ? "" : " under another replica")
                   << "; its waiting answers follow that";
  if (held && t.release) RecordRelease(id);  // it did not land: again, with the new token
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
    if (op.durable_done) {
      const bool landed = !gone && op.end <= covered;
      if (landed) {
        op.durable_done(absl::OkStatus(), op.end);
      } else {
        op.durable_done(!held && !gone ? Moved(id) : NotRecorded(id, end), durable);
      }
      continue;
    }
    if (!op.done) continue;
    absl::Status result = op.result;
    if (op.held_back) {
      result =
          !held && !gone ? Moved(id) : absl::UnavailableError(absl::StrCat("session ", EchoId(id), ": not written"));
    } else if (op.kind == Op::kCreate) {
      result = held && !gone ? absl::OkStatus()
                             : absl::UnavailableError(absl::StrCat("session ", EchoId(id),
                                                                   ": the state store did not record its creation"));
    } else if (op.kind == Op::kDelete) {
      result = gone ? absl::OkStatus()
                    : absl::UnavailableError(
                          absl::StrCat("session ", EchoId(id), ": the state store did not record its deletion"));
    } else if (op.kind == Op::kRewind) {
      result = held && !gone && end == op.end
                   ? absl::OkStatus()
                   : (!held && !gone ? Moved(id)
                                     : absl::UnavailableError(absl::StrCat(
                                           "session ", EchoId(id), ": the state store did not record the rewind")));
    }
    op.done(result);
  }
  if (!again.empty()) {
    absl::MutexLock lock(&mu_);
    for (auto op = again.rbegin(); op != again.rend(); ++op) queue_.push_front(std::move(*op));
    enqueued_ += static_cast<int64_t>(again.size());
  }
  return absl::OkStatus();
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
