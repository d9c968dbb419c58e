#include "model/net/gemv_calibration.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <limits>

namespace txl {

GemvCalibration CalibrateGemvAhead(const std::vector<GemvMatrix>& matrices, KernelIsa isa,
                                   const GemvCalibrationConfig& config) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::vector<GemvMatrix> pass;
  int64_t bytes = 0, widest = 1, tallest = 1;
  for (const GemvMatrix& m : matrices) {
    if (bytes >= config.pass_bytes) break;
    pass.push_back(m);
    bytes += m.rows * m.cols * ElemBytes(m.w.elem);
    widest = std::max(widest, m.cols);
    tallest = std::max(tallest, m.rows);
  }
  const std::vector<float> x(widest, 1.0f);
  std::vector<float> y(tallest);
  const int64_t parts = std::max(1, at::get_num_threads());
  auto time_pass = [&](int64_t ahead) {
    const auto t0 = Clock::now();
    at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
      for (const GemvMatrix& m : pass) {
        WeightMatrix w = m.w;
        w.ahead = ahead;
        GemvRows(w, x.data(), nullptr, false, y.data(), m.cols, begin * m.rows / parts, end * m.rows / parts, isa);
      }
    });
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  GemvCalibration out;
  const int64_t n = static_cast<int64_t>(config.candidates.size());
  out.seconds.assign(n, std::numeric_limits<double>::infinity());
  if (n > 0) time_pass(config.candidates[0]);  // pages and caches warm
  for (int r = 0; r < config.rounds; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = (i + r) % n;  // a different order each round, against drift
      out.seconds[c] = std::min(out.seconds[c], time_pass(config.candidates[c]));
    }
  }
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (out.seconds[i] < out.seconds[best]) best = i;
  }
  out.ahead = n > 0 ? config.candidates[best] : 0;
  out.total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

}  // namespace txl
