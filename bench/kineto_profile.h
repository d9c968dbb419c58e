// Steps under libtorch's profiler (Kineto: CPU ops, and CUDA kernels through
// CUPTI), for step_loop --profile: where a GPU step's time goes, by kernel.
#ifndef TXL_BENCH_KINETO_PROFILE_H_
#define TXL_BENCH_KINETO_PROFILE_H_

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace step_loop {

struct ProfileConfig {
  int steps = 20;     // profiled calls of the step
  int top = 25;       // kernels listed, by time
  std::string trace;  // Chrome trace file (chrome://tracing, Perfetto); empty: none
};

// Runs `step` config.steps times under the profiler, then prints to `out` the
// device's time per step by kernel name (largest first) and in all; then the
// wall time per step against the device's busy and idle time, its largest
// idle gaps (where the host held it up) and the host's ops by time. A build
// whose libtorch has no Kineto gets an error naming it.
absl::Status ProfileSteps(const std::function<absl::Status()>& step, const ProfileConfig& config, std::ostream& out);

}  // namespace step_loop

#endif  // TXL_BENCH_KINETO_PROFILE_H_
