// Our kernels' launches without CUDA (the Debian build's libtorch has none):
// a CPU model runs their CPU forms instead, so a call here is a bug.
#include <c10/util/Exception.h>

#include "model/net/cuda_launch.h"

namespace txl {

bool CudaLaunchesQueueOnADevice() { return false; }

void LaunchSplitDecodeAttention(const SplitDecodeArgs&, int) {
  TORCH_CHECK(false,
              "SplitDecodeAttention's CUDA kernels need a build against a CUDA libtorch (scripts/cuda_build.sh)");
}

void LaunchResidualLayerNorm(const ResidualNormArgs&, int) {
  TORCH_CHECK(false, "ResidualLayerNorm's CUDA kernel needs a build against a CUDA libtorch (scripts/cuda_build.sh)");
}

void LaunchSkinnyProduct(const SkinnyProductArgs&, int) {
  TORCH_CHECK(false, "SkinnyProduct's CUDA kernel needs a build against a CUDA libtorch (scripts/cuda_build.sh)");
}

}  // namespace txl
