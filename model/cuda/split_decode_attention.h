// The CUDA build's launch of SplitDecodeAttention (model/kernels/
// split_decode_attention.h): two kernels on `stream` (a cudaStream_t), the
// chunks' partials and then their combination. Torch-free; compiled only
// against a CUDA libtorch (scripts/cuda_build.sh), and called only by
// model/net/cuda_launch.cc, which passes libtorch's current stream so that a
// decode graph's capture records them.
#ifndef TXL_MODEL_CUDA_SPLIT_DECODE_ATTENTION_H_
#define TXL_MODEL_CUDA_SPLIT_DECODE_ATTENTION_H_

#include "model/kernels/split_decode_attention.h"

namespace txl {

// Null once both are queued, else CUDA's description of the launch error.
const char* LaunchSplitDecodeAttention(const SplitDecodeArgs& a, void* stream);

}  // namespace txl

#endif  // TXL_MODEL_CUDA_SPLIT_DECODE_ATTENTION_H_
