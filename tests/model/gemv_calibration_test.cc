// The prefetch distance of one session's narrow products, timed at load
// (model/net/gemv_calibration.h).
#include "model/net/gemv_calibration.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "model/net/incremental.h"
#include "tests/model/model_fixture.h"

namespace txl {
namespace {

// Every candidate is timed, and the one chosen is the fastest of them.
TEST(GemvCalibrationTest, TimesEveryCandidateAndTakesTheFastest) {
  const at::Tensor w = at::randn({300, 256}).to(at::kBFloat16);
  GemvMatrix m;
  m.w.data = w.data_ptr();
  m.w.elem = Elem::kBf16;
  m.w.ld = 256;
  m.rows = 300;
  m.cols = 256;
  GemvCalibrationConfig config;
  config.candidates = {0, 4, 16};
  config.rounds = 2;
  const GemvCalibration c = CalibrateGemvAhead({m, m}, KernelIsa::kBest, config);
  ASSERT_EQ(c.seconds.size(), 3u);
  for (double s : c.seconds) EXPECT_GT(s, 0);
  const auto fastest = std::min_element(c.seconds.begin(), c.seconds.end()) - c.seconds.begin();
  EXPECT_EQ(c.ahead, config.candidates[fastest]);
  EXPECT_GE(c.total_seconds, c.seconds[0] + c.seconds[1] + c.seconds[2]);
}

// A bfloat16 model on the CPU kernels calibrates at load and says what it
// chose; a float32 one reads panels and has nothing to choose.
TEST(GemvCalibrationTest, ReducedModelsNameTheirDistance) {
  const ModelConfig c = testing::SmallConfig();
  IncrementalModel::Precision bf16;
  bf16.dtype = WeightDtype::kBfloat16;
  const IncrementalModel reduced(c, testing::TestWeights(c, 1), at::kCPU, bf16);
  EXPECT_NE(reduced.KernelPath().find(" ahead, timed at load in "), std::string::npos) << reduced.KernelPath();
  const IncrementalModel exact(c, testing::TestWeights(c, 1), at::kCPU);
  EXPECT_EQ(exact.KernelPath().find(" ahead"), std::string::npos) << exact.KernelPath();
}

}  // namespace
}  // namespace txl
