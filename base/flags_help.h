// ListOwnFlagsInHelp: makes `--help` of a binary list the flags its main
// file defines. absl's default shows only flags from a file named after the
// program (txl-server.cc), which none of ours is, so --help said "No flags
// matched". Call it before absl::ParseCommandLine.
#ifndef TXL_BASE_FLAGS_HELP_H_
#define TXL_BASE_FLAGS_HELP_H_

#include <string>

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace txl {

inline void ListOwnFlagsInHelp() {
  absl::FlagsUsageConfig config;
  // Flags live only in the mains (main.cc, *_main.cc) and the benchmarks' single files.
  config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "main.cc") || absl::StartsWith(file, "bench/") || absl::StrContains(file, "/bench/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  // "server/main.cc", not the build machine's absolute path.
  config.normalize_filename = [](absl::string_view file) -> std::string {
    for (absl::string_view room : {"/server/", "/client/", "/model/", "/bench/", "/tools/", "/train/"}) {
      if (size_t at = file.rfind(room); at != absl::string_view::npos) return std::string(file.substr(at + 1));
    }
    return std::string(file);
  };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace txl

#endif  // TXL_BASE_FLAGS_HELP_H_
