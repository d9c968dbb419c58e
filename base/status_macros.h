// RETURN_IF_ERROR / ASSIGN_OR_RETURN: the early returns of absl::Status
// code, written once instead of by hand at every call.
//   RETURN_IF_ERROR(expr);             expr is an absl::Status
//   ASSIGN_OR_RETURN(lhs, expr);       expr is an absl::StatusOr<T>; lhs gets the T
// Both return the error as it is (no message added). Where the caller adds context,
// WithContext keeps the code and puts the context in front of the message.
#ifndef TXL_BASE_STATUS_MACROS_H_
#define TXL_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define RETURN_IF_ERROR(expr)                                                       \
  do {                                                                              \
    if (::absl::Status txl_status_ = (expr); !txl_status_.ok()) return txl_status_; \
  } while (false)

#define TXL_STATUS_CONCAT_INNER(a, b) a##b
#define TXL_STATUS_CONCAT(a, b) TXL_STATUS_CONCAT_INNER(a, b)
#define TXL_ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr)    \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)
#define ASSIGN_OR_RETURN(lhs, rexpr) TXL_ASSIGN_OR_RETURN_IMPL(TXL_STATUS_CONCAT(txl_statusor_, __LINE__), lhs, rexpr)

namespace txl {

// "CONTEXT: MESSAGE" with the status's own code; OK stays OK.
inline absl::Status WithContext(absl::string_view context, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace txl

#endif  // TXL_BASE_STATUS_MACROS_H_
