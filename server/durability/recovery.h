// Recovery: sessions read back from the state store into the live table, at
// start-up (the sessions this replica held) and on adoption (a session a
// replica that is gone held). docs/SESSIONS.md, "Session semantics", "Durability".
#ifndef TXL_SERVER_DURABILITY_RECOVERY_H_
#define TXL_SERVER_DURABILITY_RECOVERY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/durability/session_journal.h"
#include "server/sessions/session_table.h"

namespace txl {

// The state a journal record rebuilds: its image, then every history token
// but the last, which stays pending (returned in `pending`).
std::shared_ptr<IdleSession> IdleFromRecord(const JournalRecord& record, std::vector<int>* pending);

// Registers a record's session in `table`, out of device memory; it comes
// back on its first request. ALREADY_EXISTS if the id is live here.
absl::Status AddRecordedSession(const JournalRecord& record, SessionTable* table);

// Start-up: registers the sessions this replica held when it last ran (a
// restart, or a crash). A damaged one is reported and quarantined, one of
// another model is reported and left alone, and the rest still load.
// Returns how many were registered.
absl::StatusOr<int> RecoverSessions(SessionJournal* journal, SessionTable* table, const std::string& fingerprint);

}  // namespace txl

#endif  // TXL_SERVER_DURABILITY_RECOVERY_H_
