// ProfileSteps: libtorch's Kineto profiler around a loop of steps.
#include "bench/kineto_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/device_timeline.h"

namespace step_loop {
namespace {

// An event's start and duration: libtorch 2.x counts in ns, 1.13 (Debian's)
// in us. Device events are on the host's clock (Kineto converts them).
uint64_t StartNs(const torch::autograd::profiler::KinetoEvent& e) {
#if TORCH_VERSION_MAJOR >= 2
  return e.startNs();
#else
  return e.startUs() * 1000;
#endif
}

uint64_t DurationNs(const torch::autograd::profiler::KinetoEvent& e) {
#if TORCH_VERSION_MAJOR >= 2
  return e.durationNs();
#else
  return e.durationUs() * 1000;
#endif
}

// Where the step's wall time went beside the device's: how long the device
// was busy (its kernels and copies, overlaps counted once) and idle within
// the profiled span, its idle gaps of 5 us or more with the largest three
// and what ran on either side; then the host's ops by time (inclusive: an
// op's time holds the ops it calls). A step bound by its host shows as
// device idle time, and the gaps say where in the step the host held it up.
void PrintHostAndIdle(const std::vector<DeviceInterval>& device,
                      const std::map<std::string, std::pair<int64_t, uint64_t>>& host, double wall_ns,
                      const ProfileConfig& config, std::ostream& out) {
  const double per = 1e-3 / config.steps;  // ns in all -> us per step
  const std::vector<DeviceInterval> busy = BusyIntervals(device);
  uint64_t busy_ns = 0;
  for (const DeviceInterval& b : busy) busy_ns += b.end - b.start;
  out << absl::StrFormat("wall time per step: %.1f us; the device busy %.1f us of it", wall_ns * per, busy_ns * per);
  if (!busy.empty()) {
    const uint64_t span = busy.back().end - busy.front().start;
    out << absl::StrFormat(", idle %.1f us between its first kernel and its last", (span - busy_ns) * per);
  }
  out << "\n";
  std::vector<IdleGap> gaps = IdleGaps(busy, 5000);
  uint64_t gaps_ns = 0;
  for (const IdleGap& g : gaps) gaps_ns += g.ns;
  std::sort(gaps.begin(), gaps.end(), [](const IdleGap& a, const IdleGap& b) { return a.ns > b.ns; });
  out << absl::StrFormat("device idle gaps of 5 us or more: %.1f a step, %.1f us a step\n",
                         static_cast<double>(gaps.size()) / config.steps, gaps_ns * per);
  for (size_t i = 0; i < std::min<size_t>(3, gaps.size()); ++i) {
    out << absl::StrFormat("  %.1f us after %s, before %s\n", gaps[i].ns * 1e-3, gaps[i].before.substr(0, 60),
                           gaps[i].after.substr(0, 60));
  }
  std::vector<std::pair<std::string, std::pair<int64_t, uint64_t>>> ops(host.begin(), host.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  out << "host ops by time (inclusive: an op's time holds the ops it calls):\n";
  out << absl::StrFormat("%10s %7s  %s\n", "us/step", "calls", "op");
  for (int i = 0; i < std::min<int>(12, static_cast<int>(ops.size())); ++i) {
    const auto& [name, s] = ops[i];
    out << absl::StrFormat("%10.1f %7.1f  %s\n", s.second * per, static_cast<double>(s.first) / config.steps,
                           name.substr(0, 110));
  }
}

}  // namespace

absl::Status ProfileSteps(const std::function<absl::Status()>& step, const ProfileConfig& config, std::ostream& out) {
  namespace impl = torch::profiler::impl;
  namespace profiler = torch::autograd::profiler;
  if (config.steps <= 0) return absl::InvalidArgumentError("profile: steps must be at least 1");
  std::unique_ptr<profiler::ProfilerResult> result;
  bool enabled = false;
  double wall_ns = 0;
  try {
    const impl::ProfilerConfig kineto(impl::ProfilerState::KINETO);
    const std::set<impl::ActivityType> activities = {impl::ActivityType::CPU, impl::ActivityType::CUDA};
    profiler::prepareProfiler(kineto, activities);
    profiler::enableProfiler(kineto, activities);
    enabled = true;
    absl::Status status;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < config.steps && status.ok(); ++i) status = step();
    wall_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
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
  std::map<std::string, std::pair<int64_t, uint64_t>> host;  // calls and ns by op
  std::vector<DeviceInterval> device;
  uint64_t total = 0;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA) {
      auto& [calls, ns] = host[e.name()];
      ++calls;
      ns += DurationNs(e);
      continue;
    }
    device.push_back({StartNs(e), StartNs(e) + DurationNs(e), e.name(), e.name()});
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
  PrintHostAndIdle(device, host, wall_ns, config, out);
  return absl::OkStatus();
}

}  // namespace step_loop
