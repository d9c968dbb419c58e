// ResidualLayerNorm's CPU form (model/kernels/residual_layer_norm.h), whose
// arithmetic the CUDA kernel shares, against libtorch's add and layer_norm.
#include "model/kernels/residual_layer_norm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "model/net/txl_math.h"

namespace txl {
namespace {

// LayerNorm(x + add) both ways, for a float32 or bfloat16 add; rows split
// across two calls as at::parallel_for splits them.
void Check(int64_t rows, int64_t width, at::ScalarType add_type, double offset, double spread = 1) {
  at::manual_seed(rows * 131 + width);
  // With an offset far from zero, a one-pass float32 variance
  // (E[x^2] - E[x]^2) would lose the rows' spread to cancellation; with a
  // spread of 1e-3 the variance (about 1.3e-5) is near eps, which then
  // moves every result.
  const at::Tensor x = at::randn({rows, width}) * 3 * spread + offset;
  const at::Tensor add = (at::randn({rows, width}) * 2 * spread).to(add_type);
  const at::Tensor w = at::randn({width}), b = at::randn({width});
  at::Tensor out = at::full({rows, width}, 7.0f);
  ResidualNormArgs a;
  a.rows = rows;
  a.width = width;
  a.x = x.data_ptr<float>();
  a.add = add.data_ptr();
  a.add_bf16 = add_type == at::kBFloat16;
  a.weight = w.data_ptr<float>();
  a.bias = b.data_ptr<float>();
  a.eps = static_cast<float>(kLayerNormEps);
  a.out = out.data_ptr<float>();
  ResidualLayerNormCpu(a, rows / 2, rows);
  ResidualLayerNormCpu(a, 0, rows / 2);
  // The float32 sum (as torch adds them), normalised in double: libtorch's
  // own float32 layer_norm strays from it by as much as this does.
  const at::Tensor sum = x + add;
  const at::Tensor want = LayerNorm(sum.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
  const double worst = (out.to(at::kDouble) - want).abs().max().item<double>();
  const double torch_worst = (LayerNorm(sum, w, b).to(at::kDouble) - want).abs().max().item<double>();
  std::cout << rows << " x " << width << ", offset " << offset << ": " << worst << " from double (libtorch's "
            << torch_worst << ")\n";
  // Where the rows sit far from zero, float32's rounding of the mean and of
  // each centred sum is what limits any float32 norm.
  EXPECT_LT(worst, 4e-6 * (1 + w.abs().max().item<double>()) * (1 + std::abs(offset) / 50));
}

TEST(ResidualLayerNormTest, MatchesLibtorchsAddAndLayerNorm) {
  Check(1, 512, at::kFloat, 0);
  Check(5, 410, at::kFloat, 0);
  Check(3, 7, at::kFloat, 0);
  Check(4, 1, at::kFloat, 0);  // one column: the result is the bias
  Check(6, 256, at::kFloat, 1000);
  Check(3, 300, at::kFloat, 0, 1e-3);  // eps: 1e-6 instead of 1e-5 moves results by about 0.4
}

TEST(ResidualLayerNormTest, AddsABfloat16SublayerInFloat32) { Check(5, 410, at::kBFloat16, 0); }

}  // namespace
}  // namespace txl
