// A post-norm layer's residual add and layer norm as one pass over each
// row: out = LayerNorm(x + add) with the row's mean and variance, as
// at::layer_norm computes it (biased variance, eps inside the square
// root). On a GPU one kernel (model/cuda/residual_layer_norm.cu) replaces
// the add's and the norm's, twice a layer; the CPU form below is what
// `--kernels generic` takes, so that the tests check its arithmetic, which
// the kernel shares (ResidualNormSum, ResidualNormOut, ResidualNormStore).
// Torch-free, and free of CUDA headers.
#ifndef TXL_MODEL_KERNELS_RESIDUAL_LAYER_NORM_H_
#define TXL_MODEL_KERNELS_RESIDUAL_LAYER_NORM_H_

#include <cstdint>

#include "model/kernels/host_device.h"

namespace txl {

// The widest rows the kernel takes (their sums fit in the 48 KB of shared
// memory a launch gets without opting in); IncrementalModel::AddNorm runs
// wider ones as the add and at::layer_norm.
constexpr int64_t kResidualNormMaxWidth = 8192;

struct ResidualNormArgs {
  int64_t rows = 0, width = 0;
  const float* x = nullptr;   // [rows, width]: the residual stream
  const void* add = nullptr;  // [rows, width]: the sublayer's output, float32 or bfloat16 (add_bf16)
  bool add_bf16 = false;
  const float* weight = nullptr;  // [width]
  const float* bias = nullptr;    // [width]
  float eps = 1e-5f;
  float* out = nullptr;  // [rows, width]
  // Optional, [rows, width]: the result rounded to bfloat16 as torch rounds
  // it, the next products' input where activations are bfloat16, so that no
  // conversion of the residual stream follows.
  void* out_bf16 = nullptr;
};

// Element i of row r's sum, in float32 as torch adds a bfloat16 tensor to a
// float32 one.
TXL_HOST_DEVICE inline float ResidualNormSum(const ResidualNormArgs& a, int64_t r, int64_t i) {
  return a.x[r * a.width + i] + LoadAsFloat(a.add, a.add_bf16, r * a.width + i);
}

// Element i of a row's result from its centred sum and the row's 1/sqrt(var + eps).
TXL_HOST_DEVICE inline float ResidualNormOut(const ResidualNormArgs& a, int64_t i, float centred, float rstd) {
  return centred * rstd * a.weight[i] + a.bias[i];
}

// Stores element i of row r's result: to out, and rounded to out_bf16.
TXL_HOST_DEVICE inline void ResidualNormStore(const ResidualNormArgs& a, int64_t r, int64_t i, float value) {
  a.out[r * a.width + i] = value;
  if (a.out_bf16 != nullptr) StoreFromFloat(a.out_bf16, true, r * a.width + i, value);
}

// Rows [begin, end), each in two passes (its mean, then the sum of squared
// deviations from it), accumulated in double.
void ResidualLayerNormCpu(const ResidualNormArgs& a, int64_t begin, int64_t end);

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_RESIDUAL_LAYER_NORM_H_
