#include "server/durability/recovery.h"

#include <algorithm>

#include "base/log.h"
#include "base/status_macros.h"

namespace txl {

std::shared_ptr<IdleSession> IdleFromRecord(const JournalRecord& record, std::vector<int>* pending) {
  auto idle = std::make_shared<IdleSession>();
  idle->state = record.image.state;
  idle->mem_len = record.meta.mem_len;
  // The snapshot's position counts its pending token, which is fed first.
  idle->start = record.image.position - static_cast<int64_t>(record.image.pending.size());
  idle->feed = record.image.pending;
  idle->feed.insert(idle->feed.end(), record.tail.begin(), record.tail.end());
  pending->clear();
  if (!idle->feed.empty()) {
    pending->push_back(idle->feed.back());
    idle->feed.pop_back();
  }
  return idle;
}

TokenHistory HistoryFromRecord(const JournalRecord& record, const SessionTableConfig& config) {
  TokenHistory history(record.history_start(), record.earlier);
  history.Append(record.tail, config.history_tokens);
  return history;
}

namespace {

// The version `record` names, loaded for it; FAILED_PRECONDITION when that
// version's file no longer has the record's fingerprint.
absl::StatusOr<std::shared_ptr<ServedModel>> KeptFor(const JournalRecord& record, ModelRepository* repository) {
  ASSIGN_OR_RETURN(const ModelRef ref, ParseModelRef(record.meta.model));
  if (ref.name.empty() || ref.version == 0) return absl::NotFoundError("the record names no version");
  ASSIGN_OR_RETURN(std::shared_ptr<ServedVersion> kept, repository->Keep(ref.name, ref.version));
  auto model = std::static_pointer_cast<ServedModel>(kept);
  if (model->engine()->fingerprint() != record.image.fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(record.meta.model, " now has fingerprint ",
                                                      model->engine()->fingerprint(), ", the session's was ",
                                                      record.image.fingerprint));
  }
  return model;
}

// A waiting session's idle ttl, as SessionTable::AddIdle would give it.
absl::Duration WaitingTtl(absl::Duration recorded, const SessionTableConfig& config) {
  return recorded > absl::ZeroDuration() ? std::min(recorded, config.max_ttl) : config.default_ttl;
}

}  // namespace

RecordModel RecordsOf(const ModelSource* models, ModelRepository* repository) {
  return [models, repository](const JournalRecord& record) -> absl::StatusOr<std::shared_ptr<ServedModel>> {
    auto model = models->WithFingerprint(record.image.fingerprint);
    if (!model.ok() && repository != nullptr && !record.meta.model.empty()) {
      auto kept = KeptFor(record, repository);
      if (kept.ok()) return kept;
      if (absl::IsResourceExhausted(kept.status())) {  // the model memory budget: the session waits
        return absl::ResourceExhaustedError(absl::StrCat("session ", record.meta.id, ": its version ",
                                                         record.meta.model,
                                                         " does not fit: ", kept.status().message()));
      }
      return absl::FailedPreconditionError(absl::StrCat("session ", record.meta.id, ": ", model.status().message(),
                                                        "; its version ", record.meta.model,
                                                        " could not be loaded: ", kept.status().message()));
    }
    if (!model.ok())
      return absl::Status(model.status().code(),
                          absl::StrCat("session ", record.meta.id, ": ", model.status().message()));
    return model;
  };
}

absl::Status AddRecordedSession(const JournalRecord& record, std::shared_ptr<ServedModel> model, SessionTable* table) {
  std::vector<int> pending;
  std::shared_ptr<IdleSession> idle = IdleFromRecord(record, &pending);
  return table->AddIdle(record.meta.id, record.meta.owner, std::move(model), record.meta.idle_ttl, record.meta.labels,
                        record.meta.created, std::move(idle), std::move(pending), record.position(),
                        static_cast<int64_t>(record.tail.size()), HistoryFromRecord(record, table->config()));
}

absl::StatusOr<int> RecoverSessions(SessionJournal* journal, SessionTable* table, const RecordModel& model_of) {
  ASSIGN_OR_RETURN(std::vector<std::string> held, journal->Held());
  int recovered = 0;
  for (const std::string& id : held) {
    auto record = journal->Recover(id);  // DATA_LOSS: reported and quarantined by Load
    if (!record.ok()) continue;
    auto model = model_of(*record);
    if (absl::IsResourceExhausted(model.status())) {
      SessionJournal::WaitingSession waiting{id, record->meta.owner, record->meta.model, record->image.fingerprint};
      waiting.why = absl::StrCat(model.status().message(),
                                 "; it is kept in the state store, and comes back once there is room for its version "
                                 "(an unload, a version freed, or a restart with a larger budget)");
      TXL_LOG(WARNING) << waiting.why;
      waiting.expires = absl::Now() + WaitingTtl(record->meta.idle_ttl, table->config());
      journal->Wait(std::move(waiting));  // still held here
      continue;
    }
    if (!model.ok()) {
      TXL_LOG(WARNING) << "session " << id << " not recovered: " << model.status().message();
      journal->RecordRelease(id);  // a replica that serves its model may adopt it
      continue;
    }
    if (AddRecordedSession(*record, *std::move(model), table).ok()) ++recovered;
  }
  return recovered;
}

}  // namespace txl
