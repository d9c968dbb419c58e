// Small helpers shared by the command-line tools of model/ (torch-free).
#ifndef TXL_MODEL_CLI_UTIL_H_
#define TXL_MODEL_CLI_UTIL_H_

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace txl {

inline absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace txl

#endif  // TXL_MODEL_CLI_UTIL_H_
