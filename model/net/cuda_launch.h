// txl-serve's own CUDA kernels (model/cuda/), launched on libtorch's current
// stream, so that a decode graph's capture records them. Only a build
// against a CUDA libtorch has them (cuda_launch.cc); elsewhere
// (cuda_launch_stub.cc) a launch throws: the CPU runs their CPU form.
#ifndef TXL_MODEL_NET_CUDA_LAUNCH_H_
#define TXL_MODEL_NET_CUDA_LAUNCH_H_

#include "model/kernels/residual_layer_norm.h"
#include "model/kernels/skinny_product.h"
#include "model/kernels/split_decode_attention.h"

namespace txl {

// Whether these launches queue kernels on a CUDA device (the CUDA build's
// cuda_launch.cc); false for the stubs, and for the block emulator's
// launches that emulated_device_test links instead
// (IncrementalModel::Precision::emulate_cuda_kernels).
bool CudaLaunchesQueueOnADevice();

// Queues SplitDecodeAttention on CUDA device `device_index` (where a's
// pointers are; -1: the current device), on that device's current stream;
// throws c10::Error with CUDA's reason if the launch fails.
void LaunchSplitDecodeAttention(const SplitDecodeArgs& a, int device_index);

// Queues ResidualLayerNorm the same way.
void LaunchResidualLayerNorm(const ResidualNormArgs& a, int device_index);

// Queues SkinnyProduct the same way.
void LaunchSkinnyProduct(const SkinnyProductArgs& a, int device_index);

}  // namespace txl

#endif  // TXL_MODEL_NET_CUDA_LAUNCH_H_
