// The CUDA build's launch of SkinnyProduct (model/kernels/skinny_product.h):
// one kernel on `stream` (a cudaStream_t). Torch-free; compiled only against
// a CUDA libtorch, and called only by model/net/cuda_launch.cc.
#ifndef TXL_MODEL_CUDA_SKINNY_PRODUCT_H_
#define TXL_MODEL_CUDA_SKINNY_PRODUCT_H_

#include "model/kernels/skinny_product.h"

namespace txl {

// Null once queued, else why it was not (a C string). The caller makes the
// pointers' device current.
const char* QueueSkinnyProduct(const SkinnyProductArgs& a, void* stream);

}  // namespace txl

#endif  // TXL_MODEL_CUDA_SKINNY_PRODUCT_H_
