// EchoId: a client-chosen id as error messages may repeat it. Ids come from
// anyone (a field, a header of up to the transport's limit), so a message
// echoes at most a short prefix of printable id characters: no multi-KB
// grpc-message, no control bytes in logs (docs/ROBUSTNESS.md).
#ifndef TXL_BASE_ECHO_ID_H_
#define TXL_BASE_ECHO_ID_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace txl {

inline constexpr size_t kEchoIdChars = 40;  // a session id is 32

inline std::string EchoId(absl::string_view id) {
  std::string out;
  for (size_t i = 0; i < id.size() && i < kEchoIdChars; ++i) {
    const char c = id[i];
    const bool plain =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    out += plain ? c : '?';
  }
  if (id.size() > kEchoIdChars) absl::StrAppend(&out, "... (", id.size(), " bytes)");
  return out;
}

}  // namespace txl

#endif  // TXL_BASE_ECHO_ID_H_
