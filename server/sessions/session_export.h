// SessionExport: the bytes of ExportSession and ImportSession. A session's
// full state (its engine image plus the pending token) under a format
// version, the model's fingerprint and name, and a checksum, so that an
// import into a different model or of damaged bytes is refused, never
// silently wrong.
//
// Layout, little-endian: "TXLSESS\0", uint32 version (2), uint32 fingerprint
// length + fingerprint, uint32 model length + model ("NAME@VERSION"; version
// 1 has no such field), int64 position, uint32 pending count + int32 ids,
// uint64 state length + state, uint64 Hash64 of everything before it.
//
// Threading: pure functions.
#ifndef TXL_SERVER_SESSIONS_SESSION_EXPORT_H_
#define TXL_SERVER_SESSIONS_SESSION_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace txl {

struct SessionExport {
  static constexpr uint32_t kVersion = 2;  // written; 1 is read too
  std::string fingerprint;                 // Engine::fingerprint() of the model that made it
  std::string model;                       // its NAME@VERSION (ServedModel::ref); empty in version 1
  int64_t position = 0;                    // tokens in the history: fed + pending
  std::vector<int> pending;
  std::string state;  // SessionState::AppendTo
};

std::string EncodeSessionExport(const SessionExport& e);
// INVALID_ARGUMENT: not an export, another format version, truncated or damaged.
absl::StatusOr<SessionExport> DecodeSessionExport(const std::string& bytes);
// The position an export's header states, read without decoding (or checking) the rest.
absl::StatusOr<int64_t> SessionExportPosition(const std::string& bytes);

}  // namespace txl

#endif  // TXL_SERVER_SESSIONS_SESSION_EXPORT_H_
