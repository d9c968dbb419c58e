#include "server/durability/session_journal.h"

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
  // A clean exit: this replica's sessions may be claimed at once, by a
  // replica that takes over or by this one when it restarts.
  (void)backend_->Delete(absl::StrCat("replicas/", config_.replica));
}

absl::Status SessionJournal::Heartbeat() {
  return backend_->Put(absl::StrCat("replicas/", config_.replica), absl::StrCat(absl::ToUnixNanos(absl::Now())));
}

void SessionJournal::Enqueue(std::vector<Op> ops) {
  absl::MutexLock lock(&mu_);
  for (Op& op : ops) queue_.push_back(std::move(op));
  enqueued_ += static_cast<int64_t>(ops.size());
}

void SessionJournal::RecordCreate(const SessionMeta& meta, std::string snapshot, Done done, int64_t history_start,
                                  std::vector<int> history) {
  std::vector<Op> ops;
  Op op{Op::kCreate, meta.id, EncodeSessionMeta(meta), std::move(done)};
  if (!history.empty()) op.log = EncodeLogRecord(history_start, history);
  auto position = SessionExportPosition(snapshot);
  op.session = meta.id;
  op.end = position.ok() ? *position : 0;
  op.snapshot = std::move(snapshot);
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
}

void SessionJournal::RecordTokens(const std::string& id, int64_t start, std::vector<int> tokens) {
  if (tokens.empty()) return;
  std::vector<Op> ops;
  Op op{Op::kAppend, Key(id, "log"), EncodeLogRecord(start, tokens), nullptr};
  op.session = id;
  op.start = start;
  op.end = start + static_cast<int64_t>(tokens.size());
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
}

void SessionJournal::RecordSnapshot(const std::string& id, std::string snapshot) {
  auto position = SessionExportPosition(snapshot);
  if (!position.ok()) return;  // never a snapshot nobody could read back
  std::vector<Op> ops;
  Op op{Op::kSnapshot, id, "", nullptr};
  op.session = id;
  op.end = *position;
  op.snapshot = std::move(snapshot);
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
}

void SessionJournal::RecordRewind(const std::string& id, int64_t position, std::string snapshot, Done done) {
  std::vector<Op> ops;
  Op op{Op::kRewind, id, "", std::move(done)};
  op.session = id;
  op.end = position;
  op.snapshot = std::move(snapshot);
  ops.push_back(std::move(op));
  Enqueue(std::move(ops));
}

void SessionJournal::RecordDelete(const std::string& id, Done done) {
  std::vector<Op> ops;
  ops.push_back({Op::kDelete, Key(id, "meta"), "", std::move(done)});  // first: without meta it is gone
  for (const char* part : {"snap", "log", "holder"}) ops.push_back({Op::kDelete, Key(id, part), "", nullptr});
  ops.back().session = id;  // forgotten once its holder key is gone
  ops.push_back({Op::kDelete, WantedKey(config_.replica, id), "", nullptr});
  Enqueue(std::move(ops));
}

void SessionJournal::RecordRelease(const std::string& id) {
  std::vector<Op> ops;
  ops.push_back({Op::kDelete, WantedKey(config_.replica, id), "", nullptr});
  ops.push_back({Op::kDelete, Key(id, "holder"), "", nullptr});
  ops.back().session = id;
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
  // Only this replica's requests: the scan runs between group commits, so
  // it must not grow with the number of sessions in the store.
  const std::string prefix = WantedKey(config_.replica, "");
  auto keys = backend_->List(prefix);
  if (!keys.ok()) return;
  std::vector<std::string> wanted;
  for (const std::string& key : *keys) {
    const std::string id = key.substr(prefix.size());
    auto holder = backend_->Get(Key(id, "holder"));
    if (holder.ok() && *holder == config_.replica) {
      wanted.push_back(id);
    } else if (absl::IsNotFound(holder.status()) || holder.ok()) {
      (void)backend_->Delete(key);  // no longer ours to hand over
    }
  }
  if (wanted.empty()) return;
  absl::MutexLock lock(&handoff_mu_);  // the handler's owner cannot go while it runs
  if (handoff_) handoff_(std::move(wanted));
}

void SessionJournal::After(Done fn) {
  std::vector<Op> ops;
  ops.push_back({Op::kAfter, "", "", std::move(fn)});
  Enqueue(std::move(ops));
}

void SessionJournal::AfterDurable(const std::string& id, int64_t position,
                                  std::function<void(absl::Status, int64_t)> fn) {
  std::vector<Op> ops;
  Op op{Op::kAfter, "", "", nullptr};
  op.session = id;
  op.end = position;
  op.durable_done = std::move(fn);
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
  auto it = durable_.find(id);
  return it == durable_.end() ? -1 : it->second;
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

absl::Status SessionJournal::Apply(std::vector<Op>& batch) {
  // Runs of appends go to the backend as one group commit (all or nothing);
  // the other writes keep their place in the order. After the first failure
  // nothing more of the batch is written. A session's writes must continue
  // its durable history exactly; one that does not is refused unwritten.
  std::vector<Op*> group;
  std::map<std::string, int64_t> group_end;  // the durable position once the group is written
  absl::Status status;
  auto durable = [&](const std::string& id) {
    auto it = group_end.find(id);
    if (it != group_end.end()) return it->second;
    absl::MutexLock lock(&mu_);
    return DurableLocked(id);
  };
  auto out_of_step = [](const Op& op, int64_t have) {
    return absl::UnavailableError(absl::StrCat("session ", EchoId(op.session), ": history from position ",
                                               op.start >= 0 ? op.start : op.end, " not written: the state store has ",
                                               have, " tokens of it (an earlier write failed)"));
  };
  auto commit_group = [&] {
    if (group.empty()) return;
    if (status.ok()) {
      std::vector<std::pair<std::string, std::string>> appends;
      for (Op* op : group) appends.emplace_back(op->key, std::move(op->value));
      status = backend_->Append(appends);
    }
    absl::MutexLock lock(&mu_);
    for (Op* op : group) {
      op->result = status;
      if (status.ok()) durable_[op->session] = op->end;
    }
    group.clear();
    group_end.clear();
  };
  for (Op& op : batch) {
    if (op.kind == Op::kAfter) continue;
    if (op.kind == Op::kAppend) {
      const int64_t have = durable(op.session);
      if (!status.ok()) {
        op.result = status;
      } else if (have >= 0 && (op.start > have || op.end <= have)) {  // a gap, or nothing new
        op.result = out_of_step(op, have);
      } else {
        group.push_back(&op);
        group_end[op.session] = op.end;  // an overlap replays only what is new
      }
      continue;
    }
    commit_group();
    if (!status.ok()) {
      op.result = status;
      continue;
    }
    if (op.kind == Op::kPut) status = backend_->Put(op.key, op.value);
    if (op.kind == Op::kDelete) {
      status = backend_->Delete(op.key);
      if (status.ok() && !op.session.empty()) {
        absl::MutexLock lock(&mu_);
        durable_.erase(op.session);
        snapshot_at_.erase(op.session);
      }
    }
    if (op.kind == Op::kSnapshot) {
      const int64_t have = durable(op.session);
      if (have >= 0 && have != op.end) {
        op.result = out_of_step(op, have);  // a snapshot holding history the store never acknowledged
        continue;
      }
      status = backend_->Put(Key(op.key, "snap"), op.snapshot);
      if (status.ok()) {
        absl::MutexLock lock(&mu_);
        snapshot_at_[op.session] = op.end;
      }
    }
    if (op.kind == Op::kRewind) {
      const int64_t have = durable(op.session);
      if (have >= 0 && op.end > have) {
        op.result = out_of_step(op, have);  // past what the store holds
        continue;
      }
      // Snapshot first: with the old log it replays to the old history (see the header).
      bool snapshot_later = true;  // unknown: written
      {
        absl::MutexLock lock(&mu_);
        auto at = snapshot_at_.find(op.session);
        if (at != snapshot_at_.end()) snapshot_later = at->second > op.end;
      }
      if (snapshot_later) {
        status = backend_->Put(Key(op.key, "snap"), op.snapshot);
        if (status.ok()) {
          absl::MutexLock lock(&mu_);
          snapshot_at_[op.session] = op.end;
        }
      }
      absl::StatusOr<std::string> log = std::string();
      if (status.ok()) log = backend_->Get(Key(op.key, "log"));
      if (status.ok() && absl::IsNotFound(log.status())) log = std::string();
      if (status.ok() && !log.ok()) status = log.status();
      if (status.ok()) {
        log = TruncateJournalLog(*log, op.end);
        if (!log.ok()) {  // the stored log is damaged or short: refused, not a store failure
          op.result = log.status();
          continue;
        }
        status = backend_->Put(Key(op.key, "log"), *log);
      }
      if (status.ok()) {
        absl::MutexLock lock(&mu_);
        durable_[op.session] = op.end;
      }
    }
    if (op.kind == Op::kCreate) {
      // The meta claims the id, atomically across replicas; a session that
      // exists anywhere in the store keeps its state.
      auto claimed = backend_->CompareAndSet(Key(op.key, "meta"), std::nullopt, op.value);
      if (!claimed.ok()) {
        status = claimed.status();
      } else if (!*claimed) {
        op.result = absl::AlreadyExistsError(absl::StrCat("session_id: ", EchoId(op.key), " already exists"));
        continue;
      } else {
        // A log a crash left behind by an earlier session of this id goes first.
        for (const auto& [part, value] : {std::pair<const char*, const std::string*>{"log", &op.log},
                                          {"snap", &op.snapshot},
                                          {"holder", &config_.replica}}) {
          if (status.ok()) status = backend_->Put(Key(op.key, part), value ? *value : std::string());
        }
        if (!status.ok()) {
          // Refused: the id must stay free. Undo the claim (a full disk
          // still allows unlinking; an unwritable store left nothing to undo).
          for (const char* part : {"meta", "snap", "log", "holder"}) (void)backend_->Delete(Key(op.key, part));
        } else {
          absl::MutexLock lock(&mu_);
          durable_[op.session] = op.end;
          snapshot_at_[op.session] = op.end;
        }
      }
    }
    op.result = status;
  }
  commit_group();
  return status;
}

void SessionJournal::WriterLoop() {
  absl::Time next_heartbeat = absl::Now() + config_.heartbeat_interval;
  while (true) {
    std::vector<Op> batch;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), next_heartbeat - absl::Now());
      while (!queue_.empty()) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      stopping = stopping_;
    }
    if (absl::Now() >= next_heartbeat) {
      next_heartbeat = absl::Now() + config_.heartbeat_interval;
      absl::Status beat = Heartbeat();
      if (!beat.ok()) TXL_LOG(WARNING) << "state store heartbeat: " << beat.message();
      SetHealth(beat);  // a store that takes writes again takes sessions' writes again
      FindWanted();
    }
    if (!batch.empty()) {
      // Writes first, then the acknowledgements that waited for them.
      bool writes = false;
      for (const Op& op : batch) writes = writes || op.kind != Op::kAfter;
      absl::Status s = Apply(batch);
      if (writes) SetHealth(s);
      for (Op& op : batch) {
        if (op.durable_done) {
          int64_t have = 0;
          absl::Status error;
          {
            absl::MutexLock lock(&mu_);
            have = DurableLocked(op.session);
            error = error_;
          }
          if (have >= op.end || have < 0) {  // < 0: not journaled here (nothing to wait for)
            op.durable_done(absl::OkStatus(), op.end);
          } else {
            op.durable_done(!error.ok() ? error
                                        : absl::UnavailableError(absl::StrCat(
                                              "the session state store did not record the history of session ",
                                              EchoId(op.session), " past position ", have)),
                            have);
          }
        } else if (op.done) {
          op.done(op.result);
        }
      }
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
  unreported_[id] = owner;  // the caller that gets this DATA_LOSS erases it (TakeQuarantined)
  return absl::DataLossError(absl::StrCat("session ", EchoId(id), ": its saved state is damaged (", why,
                                          "); it was quarantined in the state store"));
}

absl::StatusOr<JournalRecord> SessionJournal::Load(const std::string& id) {
  if (!IsValidStateKey(id)) return absl::NotFoundError(absl::StrCat("session ", EchoId(id), " not found"));
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
  if (log.ok()) {
    size_t valid = 0;
    if (auto s = ReplayJournalLog(*log, &record, &valid); !s.ok())
      return QuarantineSession(id, std::string(s.message()), record.meta.owner);
    if (valid < log->size()) {
      // A record a crash cut short: never acknowledged. Cut it off before
      // anything is appended after it.
      TXL_LOG(WARNING) << "session " << id << ": a log record cut short by a crash (" << log->size() - valid
                       << " bytes) was dropped";
      if (auto s = backend_->Put(Key(id, "log"), absl::string_view(*log).substr(0, valid)); !s.ok())
        return absl::UnavailableError(s.message());
    }
  }
  absl::MutexLock lock(&mu_);
  durable_[id] = record.position();  // what the history goes on from
  snapshot_at_[id] = record.image.position;
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
    if (holder.ok() && *holder == config_.replica) ids.push_back(key.substr(9, key.size() - 9 - kSuffix.size()));
  }
  return ids;
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
  if (current && *current != config_.replica) {
    auto beat = backend_->Get(absl::StrCat("replicas/", *current));
    int64_t nanos = 0;
    if (beat.ok() && absl::SimpleAtoi(*beat, &nanos) &&
        absl::Now() - absl::FromUnixNanos(nanos) < config_.holder_timeout) {
      // Ask the holder to hand it over: the proxy routes the session here now.
      (void)backend_->Put(WantedKey(*current, id), config_.replica);
      return absl::UnavailableError(absl::StrCat("session ", EchoId(id), " is served by replica ", *current,
                                                 ", which was asked to hand it over; retry shortly"));
    }
  }
  if (!current || *current != config_.replica) {
    auto claimed = backend_->CompareAndSet(Key(id, "holder"), current, config_.replica);
    if (!claimed.ok()) return absl::UnavailableError(claimed.status().message());
    if (!*claimed)
      return absl::UnavailableError(absl::StrCat("session ", EchoId(id), " was just taken over by another replica"));
  }
  auto record = Load(id);
  if (absl::IsDataLoss(record.status())) (void)TakeQuarantined(id, caller);  // the caller is told now
  return record;
}

}  // namespace txl
