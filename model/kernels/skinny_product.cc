// SkinnyProductCpu (skinny_product.h): each output's 32 lane sums, then the
// butterfly, as the CUDA kernel adds them.
#include "model/kernels/skinny_product.h"

namespace txl {

void SkinnyProductCpu(const SkinnyProductArgs& a, int64_t begin, int64_t end) {
  const int64_t e = SkinnyProductWidth(a);
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t o = begin; o < end; ++o) {
      float lane[32] = {};
      for (int64_t k = 0; k < a.cols; ++k) {
        lane[(k / e) % 32] += LoadAsFloat(a.w, a.w_bf16, o * a.cols + k) * LoadAsFloat(a.x, a.x_bf16, r * a.cols + k);
      }
      // __shfl_xor_sync's butterfly: after it every lane holds the same sum.
      for (int off = 16; off > 0; off >>= 1) {
        float next[32];
        for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ off];
        for (int l = 0; l < 32; ++l) lane[l] = next[l];
      }
      SkinnyProductStore(a, r, o, lane[0]);
    }
  }
}

}  // namespace txl
