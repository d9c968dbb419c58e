// A product of few rows, y = x W^T + bias (ReLU optional), for the generic
// path's decode steps: x [rows, cols] with at most kSkinnyMaxRows rows, W
// [outs, cols] as libtorch's Linear holds it (each output's weights
// contiguous). One session's step reads every weight once for one row of
// x, so its products are bound by reading the weights; cuBLAS's float32
// matrix-vector products read them at 0.74 TB/s of an H200's 4.8 (docs/GPU.md,
// runs 6 to 9).
//
// The CUDA kernel (model/cuda/skinny_product.cu) gives each output a warp
// for each group of up to kSkinnyRowGroup rows: lane l sums the columns of
// vectors l, l + 32, ... (SkinnyProductWidth columns each), in order, then
// the lanes' sums are added by a butterfly of shuffles. A row's sums are
// the same whichever group it is in. The CPU form below adds in exactly that order, so the two
// differ only where the device fuses a multiply and an add; `--kernels
// generic` takes it, so that the model's tests run this arithmetic.
// Torch-free, and free of CUDA headers.
#ifndef TXL_MODEL_KERNELS_SKINNY_PRODUCT_H_
#define TXL_MODEL_KERNELS_SKINNY_PRODUCT_H_

#include <cstdint>

#include "model/kernels/host_device.h"

namespace txl {

// The most rows of x one call takes (a decode step of 32 sessions), and the
// rows a warp multiplies each weight it loads by. Past 8 rows each weight is
// read once per group, from L2 after the first; IncrementalModel::
// Precision::skinny_max_rows sets where libtorch's products (cuBLAS) take
// over, at most here.
constexpr int64_t kSkinnyMaxRows = 32;
constexpr int64_t kSkinnyRowGroup = 8;

struct SkinnyProductArgs {
  int64_t rows = 0, cols = 0, outs = 0;
  const void* x = nullptr;  // [rows, cols], float32 or bfloat16 (x_bf16)
  bool x_bf16 = false;
  const void* w = nullptr;  // [outs, cols], float32 or bfloat16 (w_bf16)
  bool w_bf16 = false;
  const void* bias = nullptr;  // [outs] or null, float32 or bfloat16 (bias_bf16)
  bool bias_bf16 = false;
  bool relu = false;
  void* y = nullptr;  // [rows, outs], float32 or bfloat16 (y_bf16: rounded as torch rounds)
  bool y_bf16 = false;
};

// The columns of each lane's vectors: one 16-byte load of weights (four
// float32 or eight bfloat16 values) where x and W start on 16 bytes and the
// width divides cols, else 1.
inline int SkinnyProductWidth(const SkinnyProductArgs& a) {
  const int e = a.w_bf16 ? 8 : 4;
  const bool aligned = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0;
  return aligned && a.cols % e == 0 ? e : 1;
}

// Output (r, o) from its sum: the bias added, the ReLU, the store.
TXL_HOST_DEVICE inline void SkinnyProductStore(const SkinnyProductArgs& a, int64_t r, int64_t o, float sum) {
  if (a.bias != nullptr) sum += LoadAsFloat(a.bias, a.bias_bf16, o);
  if (a.relu && sum < 0.0f) sum = 0.0f;  // a NaN stays a NaN, as at::relu keeps it
  StoreFromFloat(a.y, a.y_bf16, r * a.outs + o, sum);
}

// Outputs [begin, end) of every row, in the kernel's order of additions.
void SkinnyProductCpu(const SkinnyProductArgs& a, int64_t begin, int64_t end);

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_SKINNY_PRODUCT_H_
