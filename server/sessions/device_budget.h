// The default session memory budget on a GPU (--session_memory_budget=-1):
// what the device has free once the model is loaded, less headroom for a
// step's work. A device that leaves less than one session's full window
// (another process holds it, say) stops start-up with an error naming the
// flags, rather than serving a table that refuses every session.
#ifndef TXL_SERVER_SESSIONS_DEVICE_BUDGET_H_
#define TXL_SERVER_SESSIONS_DEVICE_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/device_memory.h"

namespace txl {

struct DeviceBudgetConfig {
  std::string device;           // for the messages, e.g. "cuda:0"
  DeviceMemory memory;          // what the device reports once the weights are there
  int64_t headroom = 0;         // --gpu_headroom; 0: 10% of the device, at least 1 GiB
  int64_t window_bytes = 0;     // one session's full window at the default mem_len
  int64_t default_mem_len = 0;  // for the messages
  int64_t later_versions = 0;   // weights a repository may load later (--model_memory_budget)
};

// The headroom to keep free: `headroom`, or 0's default.
int64_t DeviceHeadroom(const DeviceBudgetConfig& c);

// free - headroom, or FAILED_PRECONDITION when that holds less than one window.
absl::StatusOr<int64_t> DefaultDeviceBudget(const DeviceBudgetConfig& c);

}  // namespace txl

#endif  // TXL_SERVER_SESSIONS_DEVICE_BUDGET_H_
