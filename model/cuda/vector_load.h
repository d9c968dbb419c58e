// Our kernels' wide loads of float32 or bfloat16 arrays, widened to float32
// in registers: device code, included only by model/cuda/*.cu (which the
// block emulator also compiles as C++, tests/model/cuda/).
#ifndef TXL_MODEL_CUDA_VECTOR_LOAD_H_
#define TXL_MODEL_CUDA_VECTOR_LOAD_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "model/kernels/host_device.h"

namespace txl {

// Two bfloat16 values of a 32-bit word, widened (the low half first).
__device__ inline void Widen(uint32_t w, float* out) {
  out[0] = __uint_as_float(w << 16);
  out[1] = __uint_as_float(w & 0xffff0000u);
}

// E values (1, 4 or 8) of a float32 or bfloat16 array from element
// `index`, as float32. E > 1: one 16-byte load (two for eight float32
// values, one 8-byte load for four bfloat16 ones); the array must be
// 16-byte aligned and `index` a multiple of E.
template <int E>
__device__ void LoadVector(const void* base, bool bf16, int64_t index, float* out) {
  if (E == 1) {
    out[0] = LoadAsFloat(base, bf16, index);
  } else if (bf16) {
    const uint16_t* p = static_cast<const uint16_t*>(base) + index;
    if (E == 8) {
      const uint4 w = *reinterpret_cast<const uint4*>(p);
      Widen(w.x, out);
      Widen(w.y, out + 2);
      Widen(w.z, out + 4);
      Widen(w.w, out + 6);
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(p);
      Widen(w.x, out);
      Widen(w.y, out + 2);
    }
  } else {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(base) + index);
#pragma unroll
    for (int i = 0; i < E / 4; ++i) {
      const float4 f = p[i];
      out[4 * i] = f.x;
      out[4 * i + 1] = f.y;
      out[4 * i + 2] = f.z;
      out[4 * i + 3] = f.w;
    }
  }
}

}  // namespace txl

#endif  // TXL_MODEL_CUDA_VECTOR_LOAD_H_
