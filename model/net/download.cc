// Download (download.h).
#include "model/net/download.h"

namespace txl {

std::vector<at::Tensor> Download(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  const bool device = !tensors.empty() && !tensors.front().device().is_cpu();
  // The copy that waits: the last with any elements (copy_ of an empty
  // tensor returns without waiting for the stream).
  size_t waits = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].numel() > 0) waits = i;
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.device() == tensors.front().device(), "Download: tensors on ", tensors.front().device(), " and ",
                t.device());
    if (!device) {
      out.push_back(t.contiguous());
      continue;
    }
    // Copies on one stream run in order: the waiting one's wait covers the others.
    at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    host.copy_(t, /*non_blocking=*/i != waits);
    out.push_back(std::move(host));
  }
  return out;
}

}  // namespace txl
