// SessionJournal: construction and shutdown, the public ops (each queues
// Ops for the writer thread), and what they read of the queue and the health
// (After, AfterDurable, Writable, Flush). The writer thread is in
// session_journal_writer.cc.
#include "server/durability/session_journal.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/echo_id.h"
#include "base/status_macros.h"
#include "server/durability/session_journal_internal.h"

namespace txl {

using session_journal_internal::EncodeLogRecord;
using session_journal_internal::WantedKey;

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

void SessionJournal::RecordMigration(const SessionMeta& meta, int64_t position, std::string snapshot, Done done) {
  Op op{Op::kRewind};
  op.session = meta.id;
  op.end = position;
  op.snapshot = std::move(snapshot);
  op.meta = EncodeSessionMeta(meta);
  op.replace_snapshot = true;
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
  int64_t claim = -1;
  {
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(id);
    if (it != tracked_.end()) claim = it->second.claim;  // this claim: not one made after it is queued
  }
  QueueRelease(id, claim);
}

void SessionJournal::QueueRelease(const std::string& id, int64_t claim) {
  std::vector<Op> ops(2);
  ops[0].kind = Op::kDeleteKey;
  ops[0].key = WantedKey(config_.replica, id);
  ops[1].kind = Op::kRelease;
  ops[1].session = id;
  ops[1].claim = claim;
  Enqueue(std::move(ops));
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

int64_t SessionJournal::DurableLocked(const std::string& id) const {
  auto it = tracked_.find(id);
  return it == tracked_.end() ? -1 : it->second.durable;
}

}  // namespace txl
