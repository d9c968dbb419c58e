// LaunchSplitDecodeAttention on a CUDA libtorch's current stream.
#include "model/net/cuda_launch.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "model/cuda/split_decode_attention.h"

namespace txl {

void LaunchSplitDecodeAttention(const SplitDecodeArgs& a) {
  const char* error = LaunchSplitDecodeAttention(a, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(error == nullptr, "SplitDecodeAttention's CUDA kernels did not launch: ", error);
}

}  // namespace txl
