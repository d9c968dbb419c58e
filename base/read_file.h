// Whole-file reads and writes with errors that name the path and the system's reason:
//   "PATH: cannot open: No such file or directory"  (NOT_FOUND; codes follow errno)
// The one copy of what the tools, the tokenizer, the client and the server each wrote by hand.
#ifndef TXL_BASE_READ_FILE_H_
#define TXL_BASE_READ_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace txl {

// The file's bytes. A directory is FAILED_PRECONDITION ("is a directory").
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Creates or truncates `path` and writes `contents`, then closes it (no fsync, no rename:
// a crash can leave it partly written; durable state goes through server/durability instead).
absl::Status WriteFile(const std::string& path, absl::string_view contents);

}  // namespace txl

#endif  // TXL_BASE_READ_FILE_H_
