// Recovery: sessions read back from the state store into the live table, at
// start-up (the sessions this replica held) and on adoption (a session a
// replica that is gone held). docs/SESSIONS.md, "Session semantics", "Durability".
#ifndef TXL_SERVER_DURABILITY_RECOVERY_H_
#define TXL_SERVER_DURABILITY_RECOVERY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/durability/session_journal.h"
#include "server/engine/model_source.h"
#include "server/sessions/session_table.h"

namespace txl {

// The state a journal record rebuilds: its image, then every history token
// but the last, which stays pending (returned in `pending`).
std::shared_ptr<IdleSession> IdleFromRecord(const JournalRecord& record, std::vector<int>* pending);

// The served model version a record's session belongs to (its image's
// fingerprint names it); FAILED_PRECONDITION naming the session, its model
// and what is served when this server does not serve it.
using RecordModel = std::function<absl::StatusOr<std::shared_ptr<ServedModel>>(const JournalRecord& record)>;
// The records' versions among `models`' ready ones (which must outlive it).
// With `repository` (start-up only: it loads), a record whose version is
// not ready but whose meta names it (NAME@VERSION) has it loaded for its
// session (ModelRepository::Keep), provided the file still has the
// record's fingerprint. RESOURCE_EXHAUSTED when that version does not fit
// the model memory budget.
RecordModel RecordsOf(const ModelSource* models, ModelRepository* repository = nullptr);

// Registers a record's session in `table`, out of device memory, bound to
// `model` (its version, as a RecordModel found it); it comes back on its
// first request.
// ALREADY_EXISTS if the id is live here.
absl::Status AddRecordedSession(const JournalRecord& record, std::shared_ptr<ServedModel> model, SessionTable* table);

// Start-up: registers the sessions this replica held when it last ran (a
// restart, or a crash). A damaged one is reported and quarantined, one of
// a model not served is reported and let go (another replica may adopt it),
// one whose version does not fit the model memory budget stays held here
// and waits (SessionJournal::Wait: its requests are told why; WaitingReadmitter
// brings it back once there is room, as a restart with room would), and the
// rest still load.
// Returns how many were registered.
absl::StatusOr<int> RecoverSessions(SessionJournal* journal, SessionTable* table, const RecordModel& model_of);

}  // namespace txl

#endif  // TXL_SERVER_DURABILITY_RECOVERY_H_
