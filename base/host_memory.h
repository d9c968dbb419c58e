// How much memory this process may still use: the host's (/proc/meminfo) or,
// inside a container or a systemd unit with a memory limit, the tightest
// control group's (cgroup v2 memory.max / memory.current, or v1
// memory.limit_in_bytes / memory.usage_in_bytes), walking from the process's
// group up to the root. For the server's default session budget on a CPU
// (server/sessions/host_budget.h).
#ifndef TXL_BASE_HOST_MEMORY_H_
#define TXL_BASE_HOST_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace txl {

struct HostMemory {
  int64_t total_bytes = 0;      // MemTotal, or the tightest group's limit when lower
  int64_t available_bytes = 0;  // MemAvailable, or that limit less the group's usage when lower
  std::string limited_by;       // "host", or the control group's directory that set the figures
};

// Where to read from; tests point these at files of their own.
struct HostMemorySources {
  std::string proc = "/proc";             // PROC/meminfo, PROC/self/cgroup
  std::string cgroup = "/sys/fs/cgroup";  // v2 mounted here; v1's memory controller at CGROUP/memory
};

// INTERNAL naming the file when /proc/meminfo lacks MemTotal or MemAvailable;
// control-group files that are missing or unreadable count as no limit.
absl::StatusOr<HostMemory> ReadHostMemory(const HostMemorySources& sources = {});

}  // namespace txl

#endif  // TXL_BASE_HOST_MEMORY_H_
