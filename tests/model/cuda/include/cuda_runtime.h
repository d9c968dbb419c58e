// The CUDA runtime and device functions that model/cuda/*.cu use, for the
// host: found as <cuda_runtime.h> by the emulated kernels' build
// (tests/model/cuda/*_emulated.cc), which compiles those sources as C++ and
// runs them on block_emulator.h. Only what the kernels use is here; a
// kernel that uses more fails to compile in the emulation, which is where to
// add it.
#ifndef TXL_TESTS_MODEL_CUDA_INCLUDE_CUDA_RUNTIME_H_
#define TXL_TESTS_MODEL_CUDA_INCLUDE_CUDA_RUNTIME_H_

#include <math.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "tests/model/cuda/block_emulator.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One block runs at a time, so a function's statics are its block's shared
// memory; in a section of their own, which each block starts with every byte
// 0xff (block_emulator.cc), as it does dynamic shared memory. (GCC 12 leaves
// a function template's statics out of the section: there they keep the
// last block's values.)
#define __shared__ static __attribute__((section("txl_emu_shared")))

// model/cuda/kernel_syntax.h's constructs, on the emulator.
#define TXL_LAUNCH_KERNEL(grid, block, shared_bytes, stream, ...) \
  ::txl_emu::MakeKernelCall(grid, block, shared_bytes, __VA_ARGS__)
#define TXL_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::txl_emu::DynamicShared())

using dim3 = ::txl_emu::Dim3;
#define threadIdx (::txl_emu::ThreadIndex())
#define blockIdx (::txl_emu::BlockIndex())
#define blockDim (::txl_emu::BlockDim())
#define gridDim (::txl_emu::GridDim())

struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };

inline cudaError_t cudaGetLastError() { return static_cast<cudaError_t>(::txl_emu::TakeLaunchError()); }
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  }
  return "unknown error";
}

// Macros, so that each barrier knows its line.
#define __syncthreads() ::txl_emu::SyncThreads(__FILE__, __LINE__)
#define __shfl_xor_sync(mask, value, lane_mask) ::txl_emu::ShuffleXor(mask, value, lane_mask, __FILE__, __LINE__)
// Blocks run one after another, so every load sees every earlier store.
template <typename T>
T __ldcg(const T* p) {
  return *p;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int value) { return __atomic_fetch_add(p, value, __ATOMIC_SEQ_CST); }
inline float __uint_as_float(unsigned bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

#endif  // TXL_TESTS_MODEL_CUDA_INCLUDE_CUDA_RUNTIME_H_
