// The CUDA build's launch of ResidualLayerNorm (model/kernels/
// residual_layer_norm.h): one kernel on `stream` (a cudaStream_t). Torch-free;
// compiled only against a CUDA libtorch, and called only by
// model/net/cuda_launch.cc.
#ifndef TXL_MODEL_CUDA_RESIDUAL_LAYER_NORM_H_
#define TXL_MODEL_CUDA_RESIDUAL_LAYER_NORM_H_

#include "model/kernels/residual_layer_norm.h"

namespace txl {

// Null once queued, else why it was not (a C string). The caller makes the
// pointers' device current.
const char* QueueResidualLayerNorm(const ResidualNormArgs& a, void* stream);

}  // namespace txl

#endif  // TXL_MODEL_CUDA_RESIDUAL_LAYER_NORM_H_
