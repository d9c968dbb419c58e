// Upload (upload.h).
#include "model/net/upload.h"

#include <cstring>

namespace txl {
namespace {

template <typename T>
at::Tensor UploadAs(const std::vector<T>& values, at::ScalarType type, const at::Device& device) {
  const auto opt = at::TensorOptions().dtype(type);
  if (device.is_cpu()) return at::tensor(values, opt);
  const int64_t count = static_cast<int64_t>(values.size());
  at::Tensor host = at::empty({count}, opt.pinned_memory(true));
  if (count > 0) std::memcpy(host.data_ptr<T>(), values.data(), count * sizeof(T));
  return host.to(device, /*non_blocking=*/true);
}

}  // namespace

at::Tensor Upload(const std::vector<int64_t>& values, const at::Device& device) {
  return UploadAs(values, at::kLong, device);
}

at::Tensor Upload(const std::vector<double>& values, const at::Device& device) {
  return UploadAs(values, at::kDouble, device);
}

}  // namespace txl
