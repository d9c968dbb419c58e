// Levelled log lines for library code: one line on stderr per message,
//   PROGRAM: LEVEL: message        e.g. "txl-server: warning: state store heartbeat: ..."
// written with one stdio call, so lines of concurrent threads never interleave.
//   TXL_LOG(WARNING) << "session " << id << ": " << why;   // formats only when the level passes
//   Log(LogLevel::kError, message);
// Mains choose the minimum level with SetMinLogLevel (library code defines no flags).
//
// Why ours and not Debian's glog: glog defines its own command-line flags and wants its own
// initialisation, both beside absl's flags, and is one more package to install; we need only
// levelled lines, which take the few lines below.
#ifndef TXL_BASE_LOG_H_
#define TXL_BASE_LOG_H_

#include <sstream>
#include <string>

#include "absl/strings/string_view.h"

namespace txl {

enum class LogLevel { kInfo = 0, kWarning = 1, kError = 2 };

// "info", "warning", "error": the tag a line carries.
absl::string_view LogLevelName(LogLevel level);

// Messages below `level` are dropped (default: kInfo, everything). Any thread, any time.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
inline bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= static_cast<int>(MinLogLevel()); }

// Writes "PROGRAM: LEVEL: message\n" to stderr when the level passes. PROGRAM is the
// running binary's short name (glibc's program_invocation_short_name).
void Log(LogLevel level, absl::string_view message);

namespace log_internal {

inline constexpr LogLevel INFO = LogLevel::kInfo;
inline constexpr LogLevel WARNING = LogLevel::kWarning;
inline constexpr LogLevel ERROR = LogLevel::kError;

// Collects one message and logs it when the statement ends.
class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage() { Log(level_, stream_.str()); }
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Turns the stream expression into void, so the macro is one expression (safe in if/else).
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace log_internal
}  // namespace txl

// TXL_LOG(INFO|WARNING|ERROR) << ...; the operands are not evaluated when the level is off.
#define TXL_LOG(level)                           \
  !::txl::LogEnabled(::txl::log_internal::level) \
      ? (void)0                                  \
      : ::txl::log_internal::Voidify() & ::txl::log_internal::LogMessage(::txl::log_internal::level).stream()

#endif  // TXL_BASE_LOG_H_
