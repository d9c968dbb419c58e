// The CUDA build's launch of SplitDecodeAttention (model/kernels/
// split_decode_attention.h): one kernel on `stream` (a cudaStream_t), the
// chunks' partials, whose last block per (session, head) combines them.
// Torch-free; compiled only against a CUDA libtorch (scripts/cuda_build.sh),
// and called only by model/net/cuda_launch.cc, which passes libtorch's
// current stream of the model's device so that a decode graph's capture
// records it.
#ifndef TXL_MODEL_CUDA_SPLIT_DECODE_ATTENTION_H_
#define TXL_MODEL_CUDA_SPLIT_DECODE_ATTENTION_H_

#include "model/kernels/split_decode_attention.h"

namespace txl {

// Null once it is queued, else CUDA's description of the launch error
// (a C string: this file stays free of torch and Abseil). The caller makes
// the pointers' device current.
const char* QueueSplitDecodeAttention(const SplitDecodeArgs& a, void* stream);

}  // namespace txl

#endif  // TXL_MODEL_CUDA_SPLIT_DECODE_ATTENTION_H_
