#include "base/log.h"

#include <errno.h>  // program_invocation_short_name (glibc)

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace txl {
namespace {

std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};

}  // namespace

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "unknown";
}

void SetMinLogLevel(LogLevel level) { min_level.store(static_cast<int>(level), std::memory_order_relaxed); }

LogLevel MinLogLevel() { return static_cast<LogLevel>(min_level.load(std::memory_order_relaxed)); }

void Log(LogLevel level, absl::string_view message) {
  if (!LogEnabled(level)) return;
  // A message that ends in a newline does not get a second one.
  if (!message.empty() && message.back() == '\n') message.remove_suffix(1);
  const std::string line = absl::StrCat(program_invocation_short_name, ": ", LogLevelName(level), ": ", message, "\n");
  // One call: stdio locks the stream for its duration, and stderr is unbuffered, so the
  // line reaches the file whole.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace txl
