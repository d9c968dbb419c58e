// A device's timeline from a profile (bench/kineto_profile.cc): its kernels
// and copies merged into the intervals it was busy, and the gaps between
// them, where it waited for the host.
#ifndef TXL_BENCH_DEVICE_TIMELINE_H_
#define TXL_BENCH_DEVICE_TIMELINE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace step_loop {

// [start, end) in ns, and the names of the kernels that open and close it.
struct DeviceInterval {
  uint64_t start = 0, end = 0;
  std::string first, last;
};

// Events merged where they overlap or touch, in order of time; each
// interval's `last` is the event that ends it.
std::vector<DeviceInterval> BusyIntervals(std::vector<DeviceInterval> events);

struct IdleGap {
  uint64_t ns = 0;
  std::string before, after;  // the kernels on either side
};

// The gaps of at least min_ns between consecutive busy intervals, in order of time.
std::vector<IdleGap> IdleGaps(const std::vector<DeviceInterval>& busy, uint64_t min_ns);

}  // namespace step_loop

#endif  // TXL_BENCH_DEVICE_TIMELINE_H_
