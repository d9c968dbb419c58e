// SkinnyProduct's CUDA kernel (skinny_product.h): a warp per output and
// group of up to eight rows (the grid's y), each lane streaming 16-byte
// vectors of the output's weights, eight in flight at once, against every
// row of its group (from L1), then the lanes' sums added by shuffles. No
// shared memory and no barrier: a warp past the last output exits whole.
#include "model/cuda/skinny_product.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/kernel_syntax.h"
#include "model/cuda/vector_load.h"

namespace txl {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kInFlight = 8;  // vectors of weights a lane loads before it multiplies

// Output o of the rows of group blockIdx.y, [r0, r0 + rows) with rows <= R;
// E columns a vector, of float32 or bfloat16 (kWBf16) weights.
template <int E, int R, bool kWBf16>
__global__ void __launch_bounds__(kThreads) SkinnyProduct(SkinnyProductArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= a.outs) return;
  // The group's rows, [r0, r0 + rows): x from row r0 on.
  const int r0 = static_cast<int>(blockIdx.y * kSkinnyRowGroup);  // a.rows <= kSkinnyMaxRows
  const int rows = a.rows - r0 < kSkinnyRowGroup ? static_cast<int>(a.rows - r0) : static_cast<int>(kSkinnyRowGroup);
  const void* x0 = static_cast<const char*>(a.x) + r0 * a.cols * (a.x_bf16 ? 2 : 4);
  float sum[R];
#pragma unroll
  for (int r = 0; r < R; ++r) sum[r] = 0;
  const int64_t stride = 32 * E;
  for (int64_t k0 = lane * E; k0 < a.cols; k0 += kInFlight * stride) {
    float w[kInFlight][E];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      if (k0 + u * stride < a.cols) LoadVector<E>(a.w, kWBf16, o * a.cols + k0 + u * stride, w[u]);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t k = k0 + u * stride;
      if (k >= a.cols) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        float x[E];
        LoadVector<E>(x0, a.x_bf16, r * a.cols + k, x);
#pragma unroll
        for (int e = 0; e < E; ++e) sum[r] += w[u][e] * x[e];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    for (int off = 16; off > 0; off >>= 1) sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], off);
  }
  // Every lane holds every row's sum; lane r stores row r.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (lane == r && r < rows) SkinnyProductStore(a, r0 + r, o, sum[r]);
  }
}

template <int E, bool kWBf16>
void Queue(const SkinnyProductArgs& a, cudaStream_t stream) {
  const dim3 blocks(static_cast<unsigned>((a.outs + kWarps - 1) / kWarps),
                    static_cast<unsigned>((a.rows + kSkinnyRowGroup - 1) / kSkinnyRowGroup));
  if (a.rows == 1) {
    TXL_LAUNCH_KERNEL(blocks, kThreads, 0, stream, SkinnyProduct<E, 1, kWBf16>)(a);
  } else if (a.rows == 2) {
    TXL_LAUNCH_KERNEL(blocks, kThreads, 0, stream, SkinnyProduct<E, 2, kWBf16>)(a);
  } else if (a.rows <= 4) {
    TXL_LAUNCH_KERNEL(blocks, kThreads, 0, stream, SkinnyProduct<E, 4, kWBf16>)(a);
  } else {
    TXL_LAUNCH_KERNEL(blocks, kThreads, 0, stream, SkinnyProduct<E, 8, kWBf16>)(a);
  }
}

}  // namespace

const char* QueueSkinnyProduct(const SkinnyProductArgs& a, void* stream) {
  static_assert(kSkinnyRowGroup == 8, "Queue's largest R");
  if (a.rows == 0 || a.outs == 0) return nullptr;
  if (a.rows < 0 || a.rows > kSkinnyMaxRows) return "SkinnyProduct: over kSkinnyMaxRows rows";
  if ((a.outs + kWarps - 1) / kWarps > 2147483647) return "SkinnyProduct: over 2^31 - 1 blocks of outputs";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int e = SkinnyProductWidth(a);
  if (a.w_bf16) {
    if (e == 8) {
      Queue<8, true>(a, s);
    } else {
      Queue<1, true>(a, s);
    }
  } else if (e == 4) {
    Queue<4, false>(a, s);
  } else {
    Queue<1, false>(a, s);
  }
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace txl
