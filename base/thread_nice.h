// The calling thread's nice value (Linux's per-thread scheduling priority,
// 19 lowest). Threads a thread starts afterwards inherit its value, so a
// thread that lowers its own before its first parallel loop lowers its
// OpenMP team's too.
#ifndef TXL_BASE_THREAD_NICE_H_
#define TXL_BASE_THREAD_NICE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace txl {

// `nice` in [-20, 19]; raising a priority (a value below the current one)
// needs CAP_SYS_NICE, and without it the error says so.
absl::Status SetThisThreadNice(int nice);
absl::StatusOr<int> ThisThreadNice();

}  // namespace txl

#endif  // TXL_BASE_THREAD_NICE_H_
