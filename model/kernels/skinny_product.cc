// SkinnyProductCpu (skinny_product.h): each output's 32 lane sums, then the
// butterfly, as the CUDA kernel adds them. Built with -ffp-contract=off (like
// the kernel's emulated source, tests/model/cuda/), so that no multiply and
// add fuse here and the emulated kernel's bits are these.
#include "model/kernels/skinny_product.h"

namespace txl {
namespace {

// Outputs [begin, end) of every row, x and W each float32 or bfloat16.
template <bool kXBf16, bool kWBf16>
void Outputs(const SkinnyProductArgs& a, int64_t begin, int64_t end) {
  const int64_t e = SkinnyProductWidth(a);
  for (int64_t o = begin; o < end; ++o) {
    for (int64_t r = 0; r < a.rows; ++r) {
      float lane[32] = {};
      // Vector v (columns [v e, v e + e)) is lane v % 32's.
      int l = 0;
      for (int64_t k0 = 0; k0 < a.cols; k0 += e) {
        for (int64_t k = k0; k < k0 + e; ++k)
          lane[l] += LoadAsFloat(a.w, kWBf16, o * a.cols + k) * LoadAsFloat(a.x, kXBf16, r * a.cols + k);
        l = (l + 1) % 32;
      }
      // __shfl_xor_sync's butterfly, as lane 0 sees it: at each step lane i
      // adds lane i ^ off's sum to its own, and since a + b == b + a exactly,
      // lanes i and i ^ off then hold the same bits; so the lanes below off
      // hold every distinct sum, and lane 0 ends with every lane's result.
      for (int off = 16; off > 0; off >>= 1) {
        for (int i = 0; i < off; ++i) lane[i] += lane[i + off];
      }
      SkinnyProductStore(a, r, o, lane[0]);
    }
  }
}

}  // namespace

void SkinnyProductCpu(const SkinnyProductArgs& a, int64_t begin, int64_t end) {
  if (a.x_bf16) {
    a.w_bf16 ? Outputs<true, true>(a, begin, end) : Outputs<true, false>(a, begin, end);
  } else {
    a.w_bf16 ? Outputs<false, true>(a, begin, end) : Outputs<false, false>(a, begin, end);
  }
}

}  // namespace txl
