// SkinnyProduct's CPU form (model/kernels/skinny_product.h), whose order of
// additions the CUDA kernel shares, against libtorch's products; and the
// kernel against it on a GPU.
#include "model/kernels/skinny_product.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <tuple>

#include "model/net/cuda_launch.h"

namespace txl {
namespace {

// The arguments over these tensors (on one device): x [rows, cols], w
// [outs, cols], bias [outs] (or undefined) and y [rows, outs], each float32
// or bfloat16.
SkinnyProductArgs ArgsOver(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool relu,
                           const at::Tensor& y) {
  SkinnyProductArgs a;
  a.rows = x.size(0);
  a.cols = x.size(1);
  a.outs = w.size(0);
  a.x = x.data_ptr();
  a.x_bf16 = x.scalar_type() == at::kBFloat16;
  a.w = w.data_ptr();
  a.w_bf16 = w.scalar_type() == at::kBFloat16;
  if (bias.defined()) {
    a.bias = bias.data_ptr();
    a.bias_bf16 = bias.scalar_type() == at::kBFloat16;
  }
  a.relu = relu;
  a.y = y.data_ptr();
  a.y_bf16 = y.scalar_type() == at::kBFloat16;
  return a;
}

// relu?(x w^T + bias) in double, from the same (possibly bfloat16) values.
at::Tensor Reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool relu) {
  at::Tensor y = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
  if (bias.defined()) y = y + bias.to(at::kDouble);
  return relu ? at::relu(y) : y;
}

using Shape = std::tuple<int64_t, int64_t, int64_t>;  // rows, cols, outs

// float32: within float32's rounding of a sum of `cols` products of the
// reference, as libtorch's own product is. bfloat16 (in and out): within one
// bfloat16 step of the reference, as libtorch's bfloat16 product is.
TEST(SkinnyProductTest, MatchesLibtorchsProducts) {
  for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    for (const auto& [rows, cols, outs] : {Shape{1, 512, 130}, Shape{3, 2048, 64}, Shape{8, 41, 7}, Shape{5, 36, 9}}) {
      for (const bool relu : {false, true}) {
        SCOPED_TRACE(testing::Message() << rows << " x " << cols << " by " << outs << (relu ? ", relu" : "")
                                        << (type == at::kBFloat16 ? ", bf16" : ", f32"));
        at::manual_seed(rows * 100 + cols + outs);
        const at::Tensor x = at::randn({rows, cols}).to(type), w = at::randn({outs, cols}).to(type);
        const at::Tensor bias = relu ? at::randn({outs}).to(type) : at::Tensor();
        const at::Tensor y = at::full({rows, outs}, 7.0f).to(type);
        SkinnyProductCpu(ArgsOver(x, w, bias, relu, y), outs / 2, outs);
        SkinnyProductCpu(ArgsOver(x, w, bias, relu, y), 0, outs / 2);
        const at::Tensor want = Reference(x, w, bias, relu);
        at::Tensor theirs = at::linear(x, w, bias);
        if (relu) theirs = at::relu(theirs);
        const at::Tensor size = at::matmul(x.to(at::kDouble).abs(), w.to(at::kDouble).abs().t());
        const at::Tensor bound = type == at::kFloat ? 1e-6 * (1 + size) : 8e-3 * want.abs() + 1e-6 * (1 + size);
        EXPECT_TRUE(((y.to(at::kDouble) - want).abs() <= bound).all().item<bool>());
        EXPECT_TRUE(((theirs.to(at::kDouble) - want).abs() <= bound).all().item<bool>()) << "libtorch's, the same";
      }
    }
  }
}

TEST(SkinnyProductTest, LoadsVectorsOnlyWhereAlignedAndWhole) {
  alignas(16) static float data[64];
  SkinnyProductArgs a;
  a.x = data;
  a.w = data;
  a.cols = 512;
  EXPECT_EQ(SkinnyProductWidth(a), 4);
  a.w_bf16 = true;
  EXPECT_EQ(SkinnyProductWidth(a), 8);
  a.cols = 36;
  EXPECT_EQ(SkinnyProductWidth(a), 1) << "36 bfloat16 columns: not whole vectors of 8";
  a.w_bf16 = false;
  EXPECT_EQ(SkinnyProductWidth(a), 4);
  a.x = data + 1;
  EXPECT_EQ(SkinnyProductWidth(a), 1) << "x off 16 bytes";
}

// The CUDA kernel (model/cuda/skinny_product.cu) against the CPU form: the
// same order of additions, but the device fuses multiplies and adds, so
// within float32's rounding (bfloat16 outputs: within one bfloat16 step).
// Every variant: R of 1, 2, 4 and 8, and past eight rows groups of eight
// (9, 17 and 32: the grid's y); 16-byte loads in one round of eight (512)
// and in several (2048, 4096); one value a load (41, 36 in bfloat16, and
// 301 over several rounds). On a GPU only (scripts/gpu_check.sh's unit
// step): elsewhere skipped.
TEST(SkinnyProductTest, TheCudaKernelMatchesTheCpuForm) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    for (const auto& [rows, cols, outs] :
         {Shape{1, 512, 1536}, Shape{1, 2048, 512}, Shape{2, 512, 2048}, Shape{3, 4096, 260}, Shape{5, 41, 7},
          Shape{8, 36, 130}, Shape{4, 301, 33}, Shape{9, 512, 1536}, Shape{17, 2048, 130}, Shape{32, 512, 2048},
          Shape{32, 41, 7}}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << cols << " by " << outs
                                      << (type == at::kBFloat16 ? ", bf16" : ", f32"));
      at::manual_seed(rows + cols + outs);
      const at::Tensor x = at::randn({rows, cols}).to(type), w = at::randn({outs, cols}).to(type);
      const at::Tensor bias = at::randn({outs}).to(type);
      at::Tensor ys[2];
      for (const bool cuda : {false, true}) {
        const at::Device device = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
        const at::Tensor xd = x.to(device), wd = w.to(device), bd = bias.to(device);
        ys[cuda] = at::full({rows, outs}, 7.0f, at::TensorOptions().device(device)).to(type);
        const SkinnyProductArgs a = ArgsOver(xd, wd, bd, true, ys[cuda]);
        if (cuda) {
          LaunchSkinnyProduct(a, 0);
        } else {
          SkinnyProductCpu(a, 0, outs);
        }
      }
      const at::Tensor got = ys[1].cpu().to(at::kDouble), want = ys[0].to(at::kDouble);
      const at::Tensor size = at::matmul(x.to(at::kDouble).abs(), w.to(at::kDouble).abs().t());
      const at::Tensor bound = type == at::kFloat ? 1e-6 * (1 + size) : 8e-3 * want.abs() + 1e-6 * (1 + size);
      EXPECT_TRUE(((got - want).abs() <= bound).all().item<bool>())
          << "largest difference " << (got - want).abs().max().item<double>();
    }
  }
}

}  // namespace
}  // namespace txl
