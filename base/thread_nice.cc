#include "base/thread_nice.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace txl {

namespace {

// On Linux a thread id names one thread to setpriority/getpriority (POSIX
// would take the whole process).
id_t ThisThreadId() { return static_cast<id_t>(syscall(SYS_gettid)); }

}  // namespace

absl::Status SetThisThreadNice(int nice) {
  if (nice < -20 || nice > 19) {
    return absl::InvalidArgumentError(absl::StrCat("nice value ", nice, " is outside [-20, 19]"));
  }
  if (setpriority(PRIO_PROCESS, ThisThreadId(), nice) != 0) {
    const int e = errno;
    return absl::PermissionDeniedError(
        absl::StrCat("setting a thread's nice value to ", nice, ": ", std::strerror(e),
                     e == EACCES || e == EPERM ? " (raising a priority needs CAP_SYS_NICE)" : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ThisThreadNice() {
  errno = 0;  // -1 is a valid value: errno tells a failure
  const int nice = getpriority(PRIO_PROCESS, ThisThreadId());
  const int e = errno;
  if (nice == -1 && e != 0) {
    return absl::InternalError(absl::StrCat("reading a thread's nice value: ", std::strerror(e)));
  }
  return nice;
}

}  // namespace txl
