// The decode step's CPU kernels (model/decode_kernels.h) against libtorch, in
// every instruction set this machine runs; and the build's parallel loops.
#include "model/decode_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/language_model.h"

namespace txl {
namespace {

std::vector<KernelIsa> IsasHere() {
  std::vector<KernelIsa> out;
  for (KernelIsa isa : {KernelIsa::kPlain, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (CpuRuns(isa)) out.push_back(isa);
  }
  return out;
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Shapes around the panel width (64), the vector widths (8, 16) and every
// tile height (1..6 rows and a remainder), with and without a bias, computed
// as two ranges of panels as two threads would.
TEST(DecodeKernelsTest, PackedProductMatchesLinear) {
  at::manual_seed(3);
  for (KernelIsa isa : IsasHere()) {
    for (int64_t rows : {1, 63, 64, 65, 200}) {
      for (int64_t cols : {1, 7, 64, 130}) {
        at::Tensor w = at::randn({rows, cols}), bias = at::randn({rows});
        std::vector<float> packed(PackedSize(rows, cols));
        PackPanels(w.data_ptr<float>(), rows, cols, packed.data());
        const int64_t panels = (rows + kPanel - 1) / kPanel;
        for (int64_t batch : {1, 2, 5, 6, 7, 8, 13, 14}) {
          at::Tensor x = at::randn({batch, cols});
          for (int mode = 0; mode < 3; ++mode) {  // no bias; bias; bias and relu
            const bool with_bias = mode > 0, relu = mode == 2;
            at::Tensor y = at::full({batch, rows}, 1e9);  // every entry must be written
            const float* b = with_bias ? bias.data_ptr<float>() : nullptr;
            PackedProduct(packed.data(), rows, cols, x.data_ptr<float>(), batch, b, relu, y.data_ptr<float>(), 0,
                          panels / 2, isa);
            PackedProduct(packed.data(), rows, cols, x.data_ptr<float>(), batch, b, relu, y.data_ptr<float>(),
                          panels / 2, panels, isa);
            at::Tensor want = with_bias ? at::linear(x, w, bias) : at::linear(x, w);
            if (relu) want = at::relu(want);
            EXPECT_LT(MaxAbsDiff(y, want), 1e-4 * (1 + std::sqrt(cols)))
                << "isa " << static_cast<int>(isa) << " rows " << rows << " cols " << cols << " batch " << batch
                << " mode " << mode;
          }
        }
      }
    }
  }
}

TEST(DecodeKernelsTest, GemvRowsMatchesMv) {
  at::manual_seed(4);
  for (KernelIsa isa : IsasHere()) {
    for (int64_t rows : {1, 3, 4, 9, 130}) {
      for (int64_t cols : {1, 7, 8, 64, 203}) {
        at::Tensor w = at::randn({rows, cols}), x = at::randn({cols}), bias = at::randn({rows});
        at::Tensor y = at::full({rows}, 1e9);
        const int64_t mid = rows / 2;  // two ranges, as two threads would
        for (bool relu : {false, true}) {
          GemvRows(w.data_ptr<float>(), cols, x.data_ptr<float>(), bias.data_ptr<float>(), relu, y.data_ptr<float>(),
                   cols, 0, mid, isa);
          GemvRows(w.data_ptr<float>(), cols, x.data_ptr<float>(), bias.data_ptr<float>(), relu, y.data_ptr<float>(),
                   cols, mid, rows, isa);
          at::Tensor want = at::addmv(bias, w, x);
          EXPECT_LT(MaxAbsDiff(y, relu ? at::relu(want) : want), 1e-4 * (1 + std::sqrt(cols)))
              << "isa " << static_cast<int>(isa) << " rows " << rows << " cols " << cols << " relu " << relu;
        }
        GemvRows(w.data_ptr<float>(), cols, x.data_ptr<float>(), nullptr, false, y.data_ptr<float>(), cols, 0, rows,
                 isa);
        EXPECT_LT(MaxAbsDiff(y, at::mv(w, x)), 1e-4 * (1 + std::sqrt(cols)));
        // A block of columns [a, cols) of the same rows (row stride cols).
        const int64_t a = cols / 3;
        GemvRows(w.data_ptr<float>() + a, cols, x.data_ptr<float>() + a, nullptr, false, y.data_ptr<float>(), cols - a,
                 0, rows, isa);
        EXPECT_LT(MaxAbsDiff(y, at::mv(w.slice(1, a), x.slice(0, a))), 1e-4 * (1 + std::sqrt(cols))) << "block";
      }
    }
  }
}

// The engine's tests check the widest variant against the one-pass model;
// the others must compute the same attention. Sessions of different lengths,
// wrapped rings and head sizes 64 (register path) and 24.
TEST(DecodeKernelsTest, AttentionVariantsAgree) {
  at::manual_seed(5);
  for (int64_t dh : {64, 24}) {
    const int64_t H = 3, mem_len = 11, cap = 11;
    const std::vector<int64_t> length = {10, 3, 0, 10}, position = {25, 3, 0, 10};
    const int64_t B = static_cast<int64_t>(length.size()), rel_size = 12;
    std::vector<at::Tensor> k, v;
    std::vector<DecodeSession> sessions;
    for (int64_t b = 0; b < B; ++b) {
      k.push_back(at::randn({H, cap, dh}));
      v.push_back(at::randn({H, cap, dh}));
      sessions.push_back({k[b].data_ptr<float>(), v[b].data_ptr<float>(), cap, mem_len, position[b], length[b]});
    }
    at::Tensor qkv = at::randn({B, 3, H, dh}) * 2, u_bias = at::randn({H, dh}), v_bias = at::randn({H, dh});
    at::Tensor rel = at::randn({H, rel_size, dh});
    DecodeAttentionArgs args{sessions.data(),
                             B,
                             H,
                             dh,
                             11,
                             qkv.data_ptr<float>(),
                             u_bias.data_ptr<float>(),
                             v_bias.data_ptr<float>(),
                             rel.data_ptr<float>(),
                             rel_size,
                             0.125f,
                             nullptr};
    std::vector<at::Tensor> outs;
    for (KernelIsa isa : IsasHere()) {
      at::Tensor out = at::full({B, H, dh}, 1e9);
      args.out = out.data_ptr<float>();
      DecodeAttention(args, 0, B * H, isa);
      outs.push_back(out);
    }
    for (size_t i = 1; i < outs.size(); ++i) EXPECT_LT(MaxAbsDiff(outs[i], outs[0]), 1e-5) << "dh " << dh;
    EXPECT_LT(outs[0].abs().max().item<double>(), 1e3);  // every output written
  }
}

// Regression: at::parallel_for is a header template, so model/ must itself be
// compiled with OpenMP; without it every decode kernel ran on one thread.
// The clang (sanitizer) builds cannot share libtorch's OpenMP runtime and
// stay serial by design (model/CMakeLists.txt).
TEST(DecodeKernelsTest, ParallelLoopsUseTheIntraOpThreads) {
  const int before = at::get_num_threads();
  SetThreads(2);
#if defined(__GNUC__) && !defined(__clang__)
  EXPECT_EQ(ParallelLoopThreads(), 2);
#else
  EXPECT_EQ(ParallelLoopThreads(), 1);
#endif
  SetThreads(before);
}

}  // namespace
}  // namespace txl
