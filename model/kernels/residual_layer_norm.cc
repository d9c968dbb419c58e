// ResidualLayerNormCpu: one row at a time (residual_layer_norm.h).
#include "model/kernels/residual_layer_norm.h"

#include <cmath>
#include <vector>

namespace txl {

void ResidualLayerNormCpu(const ResidualNormArgs& a, int64_t begin, int64_t end) {
  std::vector<float> sum(a.width);
  for (int64_t r = begin; r < end; ++r) {
    double total = 0;
    for (int64_t i = 0; i < a.width; ++i) {
      sum[i] = ResidualNormSum(a, r, i);
      total += sum[i];
    }
    const float mean = static_cast<float>(total / a.width);
    double squares = 0;
    for (int64_t i = 0; i < a.width; ++i) {
      const double d = sum[i] - mean;
      squares += d * d;
    }
    const float rstd = static_cast<float>(1.0 / std::sqrt(squares / a.width + a.eps));
    for (int64_t i = 0; i < a.width; ++i) ResidualNormStore(a, r, i, ResidualNormOut(a, i, sum[i] - mean, rstd));
  }
}

}  // namespace txl
