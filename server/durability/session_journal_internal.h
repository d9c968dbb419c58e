// Private to the SessionJournal's files (session_journal*.cc): the store's key
// names, the log record codec, and the answers more than one part gives. Not
// part of the public API.
#ifndef TXL_SERVER_DURABILITY_SESSION_JOURNAL_INTERNAL_H_
#define TXL_SERVER_DURABILITY_SESSION_JOURNAL_INTERNAL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/echo_id.h"
#include "server/durability/state_backend.h"

namespace txl {
namespace session_journal_internal {

inline std::string Key(const std::string& id, const char* part) { return absl::StrCat("sessions/", id, "/", part); }
// A request to `holder` to hand session `id` over (kept under the holder's
// name, so each replica lists only its own).
inline std::string WantedKey(const std::string& holder, const std::string& id) {
  return absl::StrCat("wanted/", holder, "/", id);
}

inline absl::Status Moved(const std::string& id) {
  return absl::UnavailableError(absl::StrCat("session ", EchoId(id),
                                             " is served by another replica now (it took the session over while "
                                             "this one was paused or cut off); retry"));
}

// One guarded write: the call's status and the write's outcome (kWriteApplied, ...).
inline std::pair<absl::Status, int> WriteOne(StateBackend* backend, StoreWrite write) {
  std::vector<int> outcomes;
  absl::Status s = backend->Write({std::move(write)}, &outcomes);
  return {s, outcomes.empty() ? kWriteNotApplied : outcomes[0]};
}

// An answer refused because the session's history is not written up to it.
inline absl::Status NotRecorded(const std::string& id, int64_t have) {
  return absl::UnavailableError(absl::StrCat("the session state store did not record the history of session ",
                                             EchoId(id), " past position ", have));
}

// Defined in session_journal_format.cc.
std::string EncodeLogRecord(int64_t start, const std::vector<int>& tokens);
// The log's own history: records must continue it (an overlap adds only
// what is new); a torn last record was never acknowledged (acknowledgements
// wait for the whole write).
absl::Status ParseLog(const std::string& log, int64_t* start, std::vector<int>* history, size_t* valid_bytes);

}  // namespace session_journal_internal
}  // namespace txl

#endif  // TXL_SERVER_DURABILITY_SESSION_JOURNAL_INTERNAL_H_
