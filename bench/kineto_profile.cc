// ProfileSteps: libtorch's Kineto profiler around a loop of steps.
#include "bench/kineto_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/version.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace step_loop {
namespace {

// An event's duration: libtorch 2.x counts in ns, 1.13 (Debian's) in us.
uint64_t DurationNs(const torch::autograd::profiler::KinetoEvent& e) {
#if TORCH_VERSION_MAJOR >= 2
  return e.durationNs();
#else
  return e.durationUs() * 1000;
#endif
}

}  // namespace

absl::Status ProfileSteps(const std::function<absl::Status()>& step, const ProfileConfig& config, std::ostream& out) {
  namespace impl = torch::profiler::impl;
  namespace profiler = torch::autograd::profiler;
  if (config.steps <= 0) return absl::InvalidArgumentError("profile: steps must be at least 1");
  std::unique_ptr<profiler::ProfilerResult> result;
  bool enabled = false;
  try {
    const impl::ProfilerConfig kineto(impl::ProfilerState::KINETO);
    const std::set<impl::ActivityType> activities = {impl::ActivityType::CPU, impl::ActivityType::CUDA};
    profiler::prepareProfiler(kineto, activities);
    profiler::enableProfiler(kineto, activities);
    enabled = true;
    absl::Status status;
    for (int i = 0; i < config.steps && status.ok(); ++i) status = step();
    enabled = false;
    result = profiler::disableProfiler();
    if (!status.ok()) return status;
    if (!config.trace.empty()) result->save(config.trace);
  } catch (const std::exception& e) {
    if (enabled) profiler::disableProfiler();
    const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
    return absl::FailedPreconditionError(
        absl::StrCat("the profiler (Kineto) failed; is this libtorch built with it? ",
                     torch_error != nullptr ? torch_error->what_without_backtrace() : e.what()));
  }
  struct Sum {
    int64_t calls = 0;
    uint64_t ns = 0;
  };
  std::map<std::string, Sum> by_name;
  uint64_t total = 0;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    Sum& s = by_name[e.name()];
    ++s.calls;
    s.ns += DurationNs(e);
    total += DurationNs(e);
  }
  std::vector<std::pair<std::string, Sum>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  const double per = 1e-3 / config.steps;  // ns in all -> us per step
  int64_t calls = 0;
  for (const auto& [name, s] : by_name) calls += s.calls;
  out << absl::StrFormat("device time per step: %.1f us in %.1f kernels and copies (%zu names)\n", total * per,
                         static_cast<double>(calls) / config.steps, by_name.size());
  out << absl::StrFormat("%10s %7s %6s  %s\n", "us/step", "calls", "share", "kernel");
  for (int i = 0; i < std::min<int>(config.top, static_cast<int>(rows.size())); ++i) {
    const auto& [name, s] = rows[i];
    out << absl::StrFormat("%10.1f %7.1f %5.1f%%  %s\n", s.ns * per, static_cast<double>(s.calls) / config.steps,
                           total ? 100.0 * s.ns / total : 0.0, name.substr(0, 110));
  }
  return absl::OkStatus();
}

}  // namespace step_loop
