// What a CPU form and its CUDA kernel share at the level of one value:
// TXL_HOST_DEVICE, and the loads and stores of arrays that hold float32 or
// bfloat16 (the generic path's activations and memories). Torch-free, and
// free of CUDA headers, so that the CPU build compiles it as plain C++.
#ifndef TXL_MODEL_KERNELS_HOST_DEVICE_H_
#define TXL_MODEL_KERNELS_HOST_DEVICE_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TXL_HOST_DEVICE __host__ __device__
#else
#define TXL_HOST_DEVICE
#endif

namespace txl {

// Element `index` of a float32 or bfloat16 (bf16) array, as float32.
TXL_HOST_DEVICE inline float LoadAsFloat(const void* base, bool bf16, int64_t index) {
  if (!bf16) return static_cast<const float*>(base)[index];
  const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[index]) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// Stores `value` as element `index` of a float32 or bfloat16 array: bfloat16
// rounded to nearest even (a NaN stays a NaN), as c10::BFloat16 rounds.
TXL_HOST_DEVICE inline void StoreFromFloat(void* base, bool bf16, int64_t index, float value) {
  if (!bf16) {
    static_cast<float*>(base)[index] = value;
    return;
  }
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(value);
#else
  std::memcpy(&bits, &value, sizeof bits);
#endif
  const bool nan = (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0;
  static_cast<uint16_t*>(base)[index] =
      nan ? uint16_t{0x7fc0} : static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_HOST_DEVICE_H_
