// Journaled creation: a session made here (CreateSession, a fork, an import)
// is answered only once the state store has it, so a crash after the answer
// keeps it. Until then it stays busy in the table (`lease`).
#ifndef TXL_SERVER_DURABILITY_NEW_SESSION_H_
#define TXL_SERVER_DURABILITY_NEW_SESSION_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "server/durability/session_journal.h"
#include "server/sessions/session_table.h"

namespace txl {

// Records the new session `info` (held in `lease`) with its first image;
// once written, releases it, or drops it if the store refused (the id was
// taken there, or the store failed). `done` then gets the outcome and the
// session as the client sees it (on the journal's writer thread).
void RecordNewSession(SessionJournal* journal, SessionTable* table, const SessionInfo& info, SessionLease lease,
                      std::string snapshot, std::function<void(absl::Status, const SessionInfo&)> done);

}  // namespace txl

#endif  // TXL_SERVER_DURABILITY_NEW_SESSION_H_
