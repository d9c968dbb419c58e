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

// An int8 model on the CPU kernels (which reads rows) calibrates at load
// and says what it chose; float32 and bfloat16 ones read panels and have
// nothing to choose.
TEST(GemvCalibrationTest, ModelsThatReadRowsNameTheirDistance) {
  const ModelConfig c = testing::SmallConfig();
  for (WeightDtype dtype : {WeightDtype::kInt8, WeightDtype::kBfloat16, WeightDtype::kFloat32}) {
    IncrementalModel::Precision p;
    p.dtype = dtype;
    const IncrementalModel model(c, testing::TestWeights(c, 1), at::kCPU, p);
    const bool named = model.KernelPath().find(" ahead, timed at load in ") != std::string::npos;
    EXPECT_EQ(named, dtype == WeightDtype::kInt8) << model.KernelPath();
  }
}

}  // namespace
}  // namespace txl
