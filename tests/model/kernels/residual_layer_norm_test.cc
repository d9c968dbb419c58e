// ResidualLayerNorm's CPU form (model/kernels/residual_layer_norm.h), whose
// arithmetic the CUDA kernel shares, against libtorch's add and layer_norm,
// and its bfloat16 copy against torch's rounding.
#include "model/kernels/residual_layer_norm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <tuple>

#include "model/net/cuda_launch.h"
#include "model/net/txl_math.h"

namespace txl {
namespace {

// The arguments over these tensors (on one device): x, add (float32 or
// bfloat16) and out [rows, width], w and b [width], narrow out's bfloat16 copy.
ResidualNormArgs ArgsOver(const at::Tensor& x, const at::Tensor& add, const at::Tensor& w, const at::Tensor& b,
                          const at::Tensor& out, const at::Tensor& narrow) {
  ResidualNormArgs a;
  a.rows = x.size(0);
  a.width = x.size(1);
  a.x = x.data_ptr<float>();
  a.add = add.data_ptr();
  a.add_bf16 = add.scalar_type() == at::kBFloat16;
  a.weight = w.data_ptr<float>();
  a.bias = b.data_ptr<float>();
  a.eps = static_cast<float>(kLayerNormEps);
  a.out = out.data_ptr<float>();
  a.out_bf16 = narrow.data_ptr();
  return a;
}

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
  const at::Tensor out = at::full({rows, width}, 7.0f), narrow = out.to(at::kBFloat16);
  const ResidualNormArgs a = ArgsOver(x, add, w, b, out, narrow);
  ResidualLayerNormCpu(a, rows / 2, rows);
  ResidualLayerNormCpu(a, 0, rows / 2);
  // The bfloat16 copy (the next products' input) is the result as torch
  // rounds it, bit for bit.
  EXPECT_TRUE(at::equal(narrow, out.to(at::kBFloat16)));
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

// The CUDA kernel (model/cuda/residual_layer_norm.cu) against the CPU form:
// float32 sums instead of double ones, so within float32's rounding, and
// its bfloat16 copy within one rounding of the CPU's. On a GPU only
// (scripts/gpu_check.sh's unit step): elsewhere skipped.
TEST(ResidualLayerNormTest, TheCudaKernelMatchesTheCpuForm) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [rows, width, add_type] : {std::tuple{1, 512, at::kFloat}, std::tuple{32, 410, at::kBFloat16},
                                              std::tuple{7, 8192, at::kFloat}, std::tuple{3, 1, at::kFloat}}) {
    at::manual_seed(rows + width);
    const at::Tensor x = at::randn({rows, width}) * 3, add = (at::randn({rows, width}) * 2).to(add_type);
    const at::Tensor w = at::randn({width}), b = at::randn({width});
    at::Tensor outs[2], narrows[2];
    for (const bool cuda : {false, true}) {
      const at::Device device = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
      const at::Tensor xd = x.to(device), ad = add.to(device), wd = w.to(device), bd = b.to(device);
      outs[cuda] = at::full({rows, width}, 7.0f, at::TensorOptions().device(device));
      narrows[cuda] = outs[cuda].to(at::kBFloat16);
      const ResidualNormArgs a = ArgsOver(xd, ad, wd, bd, outs[cuda], narrows[cuda]);
      if (cuda) {
        LaunchResidualLayerNorm(a, 0);
      } else {
        ResidualLayerNormCpu(a, 0, rows);
      }
    }
    const at::Tensor got = outs[1].cpu(), narrow = narrows[1].cpu().to(at::kFloat);
    const double bound = 1e-5 * (1 + w.abs().max().item<double>());
    EXPECT_LT((got - outs[0]).abs().max().item<double>(), bound) << rows << " x " << width;
    EXPECT_TRUE(((narrow - narrows[0].to(at::kFloat)).abs() <= 8e-3 * outs[0].abs() + bound).all().item<bool>())
        << rows << " x " << width << ": the bfloat16 copy";
  }
}

}  // namespace
}  // namespace txl
