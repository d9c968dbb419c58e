// model/net/cuda_launch.h's launches on the block emulator: each queues the
// kernel's source compiled as C++ (txl_emulated_kernels), which runs over
// host memory before it returns. Linked ahead of txl_model, so that these
// definitions, not cuda_launch_stub.cc's, are the ones a model calls; only
// emulated_device_test links them.
#include <c10/util/Exception.h>

#include "model/cuda/residual_layer_norm.h"
#include "model/cuda/skinny_product.h"
#include "model/cuda/split_decode_attention.h"
#include "model/net/cuda_launch.h"

namespace txl {

bool CudaLaunchesQueueOnADevice() { return false; }

void LaunchSplitDecodeAttention(const SplitDecodeArgs& a, int) {
  const char* error = QueueSplitDecodeAttention(a, nullptr);
  TORCH_CHECK(error == nullptr, "SplitDecodeAttention on the block emulator did not launch: ", error);
}

void LaunchResidualLayerNorm(const ResidualNormArgs& a, int) {
  const char* error = QueueResidualLayerNorm(a, nullptr);
  TORCH_CHECK(error == nullptr, "ResidualLayerNorm on the block emulator did not launch: ", error);
}

void LaunchSkinnyProduct(const SkinnyProductArgs& a, int) {
  const char* error = QueueSkinnyProduct(a, nullptr);
  TORCH_CHECK(error == nullptr, "SkinnyProduct on the block emulator did not launch: ", error);
}

}  // namespace txl
