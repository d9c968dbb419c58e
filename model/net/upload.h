// Host values onto a device in one copy: on a GPU from pinned host memory,
// queued on the current stream and not waited for (the caching host
// allocator keeps the buffer until the copy is done). (A copy from pageable
// memory waits for everything queued before it, so the host could not queue
// the work that follows until the device had caught up.) On a CPU, a
// tensor of the values.
#ifndef TXL_MODEL_NET_UPLOAD_H_
#define TXL_MODEL_NET_UPLOAD_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace txl {

at::Tensor Upload(const std::vector<int64_t>& values, const at::Device& device);
at::Tensor Upload(const std::vector<double>& values, const at::Device& device);

}  // namespace txl

#endif  // TXL_MODEL_NET_UPLOAD_H_
