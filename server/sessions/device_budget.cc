#include "server/sessions/device_budget.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace txl {

int64_t DeviceHeadroom(const DeviceBudgetConfig& c) {
  if (c.headroom > 0) return c.headroom;
  return std::max<int64_t>(int64_t{1} << 30, c.memory.total_bytes / 10);
}

absl::StatusOr<int64_t> DefaultDeviceBudget(const DeviceBudgetConfig& c) {
  const int64_t headroom = DeviceHeadroom(c);
  const int64_t budget = c.memory.free_bytes - headroom - c.later_versions;
  if (budget < std::max<int64_t>(1, c.window_bytes)) {
    return absl::FailedPreconditionError(absl::StrCat(
        c.device, " has ", c.memory.free_bytes, " bytes free of ", c.memory.total_bytes,
        " once the model is loaded; less ", headroom, " bytes of headroom (--gpu_headroom)",
        c.later_versions > 0
            ? absl::StrCat(" and ", c.later_versions, " for model versions loaded later (--model_memory_budget)")
            : "",
        ", that leaves no room for one session's window (", c.window_bytes, " bytes at mem_len ", c.default_mem_len,
        "). Is another process using the device? Give --session_memory_budget (bytes), or lower --gpu_headroom"));
  }
  return budget;
}

}  // namespace txl
