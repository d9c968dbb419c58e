// Device tensors onto the host with one wait for the device: every copy but
// the last non-empty one queued into pinned host memory without waiting,
// that one waiting for the stream, and so for all of them (a readout's ids and
// log-probs used to wait twice). On a CPU, the tensors as they are,
// contiguous. Each comes back in the type it had.
#ifndef TXL_MODEL_NET_DOWNLOAD_H_
#define TXL_MODEL_NET_DOWNLOAD_H_

#include <ATen/ATen.h>

#include <vector>

namespace txl {

// All of `tensors` on one device, or all on the CPU.
std::vector<at::Tensor> Download(const std::vector<at::Tensor>& tensors);

}  // namespace txl

#endif  // TXL_MODEL_NET_DOWNLOAD_H_
