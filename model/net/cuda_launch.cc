// Our kernels' launches on a CUDA libtorch's current stream.
#include "model/net/cuda_launch.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "model/cuda/residual_layer_norm.h"
#include "model/cuda/skinny_product.h"
#include "model/cuda/split_decode_attention.h"

namespace txl {
namespace {

// libtorch's ops guard their own device; a raw launch goes to the current
// one. (-1, "cuda" without an index: the current device, as libtorch reads it.)
c10::DeviceIndex LaunchDevice(int device_index) {
  return device_index < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(device_index);
}

}  // namespace

bool CudaLaunchesQueueOnADevice() { return true; }

void LaunchSplitDecodeAttention(const SplitDecodeArgs& a, int device_index) {
  const c10::DeviceIndex index = LaunchDevice(device_index);
  const c10::cuda::CUDAGuard on_device(index);
  const char* error = QueueSplitDecodeAttention(a, c10::cuda::getCurrentCUDAStream(index).stream());
  TORCH_CHECK(error == nullptr, "SplitDecodeAttention's CUDA kernels did not launch: ", error);
}

void LaunchResidualLayerNorm(const ResidualNormArgs& a, int device_index) {
  const c10::DeviceIndex index = LaunchDevice(device_index);
  const c10::cuda::CUDAGuard on_device(index);
  const char* error = QueueResidualLayerNorm(a, c10::cuda::getCurrentCUDAStream(index).stream());
  TORCH_CHECK(error == nullptr, "ResidualLayerNorm's CUDA kernel did not launch: ", error);
}

void LaunchSkinnyProduct(const SkinnyProductArgs& a, int device_index) {
  const c10::DeviceIndex index = LaunchDevice(device_index);
  const c10::cuda::CUDAGuard on_device(index);
  const char* error = QueueSkinnyProduct(a, c10::cuda::getCurrentCUDAStream(index).stream());
  TORCH_CHECK(error == nullptr, "SkinnyProduct's CUDA kernel did not launch: ", error);
}

}  // namespace txl
