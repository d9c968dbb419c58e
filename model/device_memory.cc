#include "model/device_memory.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace txl {

absl::StatusOr<DeviceMemory> CudaDeviceMemory() {
  // The driver API's entry points, by their documented C signatures
  // (CUresult is an int; 0 is CUDA_SUCCESS).
  using MemGetInfo = int (*)(size_t * free, size_t * total);
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return absl::UnavailableError(absl::StrCat("no CUDA driver: ", dlerror()));
  auto mem_get_info = reinterpret_cast<MemGetInfo>(dlsym(driver, "cuMemGetInfo_v2"));
  if (mem_get_info == nullptr) return absl::UnavailableError("the CUDA driver has no cuMemGetInfo_v2");
  size_t free = 0, total = 0;
  // The handle stays open: the driver is loaded by libtorch already.
  if (const int rc = mem_get_info(&free, &total); rc != 0)
    return absl::UnavailableError(absl::StrCat("cuMemGetInfo_v2 failed with CUresult ", rc));
  return DeviceMemory{static_cast<int64_t>(free), static_cast<int64_t>(total)};
}

}  // namespace txl
