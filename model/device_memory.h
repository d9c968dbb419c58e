// How much memory the GPU has free, for the server's default session budget
// (server/main.cc). Torch-free: it asks the CUDA driver (libcuda.so.1,
// opened at run time), so a build needs no CUDA headers.
#ifndef TXL_MODEL_DEVICE_MEMORY_H_
#define TXL_MODEL_DEVICE_MEMORY_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace txl {

struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// Of the CUDA device current on the calling thread (the one a model was just
// loaded on, by that thread). UNAVAILABLE without a driver or a context.
absl::StatusOr<DeviceMemory> CudaDeviceMemory();

}  // namespace txl

#endif  // TXL_MODEL_DEVICE_MEMORY_H_
