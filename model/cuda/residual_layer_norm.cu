// ResidualLayerNorm's CUDA kernel (residual_layer_norm.h): one block per row.
// The row's sums stay in shared memory between the block's three passes
// (the mean, the squared deviations, the result), so that x and add are read
// once and the result written once.
#include "model/cuda/residual_layer_norm.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/kernel_syntax.h"

namespace txl {
namespace {

constexpr int kNormThreads = 128;
constexpr int kNormWarps = kNormThreads / 32;
static_assert(kResidualNormMaxWidth * sizeof(float) + kNormWarps * sizeof(float) <= 48 * 1024,
              "the widest row's sums and the reduction's scratch fit in 48 KB of shared memory");

// The block's total of each thread's x, in every thread.
__device__ float BlockSum(float x, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kNormWarps; ++w) total += scratch[w];
  __syncthreads();  // every thread has read scratch before it is reused
  return total;
}

__global__ void __launch_bounds__(kNormThreads) ResidualLayerNorm(ResidualNormArgs a) {
  const int64_t r = blockIdx.x;
  TXL_DYNAMIC_SHARED(float, sums);  // [width]
  __shared__ float scratch[kNormWarps];
  float total = 0;
  for (int64_t i = threadIdx.x; i < a.width; i += kNormThreads) {
    const float s = ResidualNormSum(a, r, i);
    sums[i] = s;  // each thread reads back only its own
    total += s;
  }
  const float mean = BlockSum(total, scratch) / static_cast<float>(a.width);
  float squares = 0;
  for (int64_t i = threadIdx.x; i < a.width; i += kNormThreads) {
    const float d = sums[i] - mean;
    squares += d * d;
  }
  const float rstd = rsqrtf(BlockSum(squares, scratch) / static_cast<float>(a.width) + a.eps);
  for (int64_t i = threadIdx.x; i < a.width; i += kNormThreads)
    ResidualNormStore(a, r, i, ResidualNormOut(a, i, sums[i] - mean, rstd));
}

}  // namespace

const char* QueueResidualLayerNorm(const ResidualNormArgs& a, void* stream) {
  if (a.rows == 0) return nullptr;
  if (a.width > kResidualNormMaxWidth) return "ResidualLayerNorm: rows over kResidualNormMaxWidth wide";
  if (a.rows > 2147483647) return "ResidualLayerNorm: over 2^31 - 1 rows";
  TXL_LAUNCH_KERNEL(static_cast<unsigned>(a.rows), kNormThreads, a.width * sizeof(float),
                    static_cast<cudaStream_t>(stream), ResidualLayerNorm)(a);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace txl
