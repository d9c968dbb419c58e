// BusyIntervals and IdleGaps (device_timeline.h).
#include "bench/device_timeline.h"

#include <algorithm>
#include <utility>

namespace step_loop {

std::vector<DeviceInterval> BusyIntervals(std::vector<DeviceInterval> events) {
  std::sort(events.begin(), events.end(),
            [](const DeviceInterval& a, const DeviceInterval& b) { return a.start < b.start; });
  std::vector<DeviceInterval> busy;
  for (DeviceInterval& e : events) {
    if (!busy.empty() && e.start <= busy.back().end) {
      if (e.end > busy.back().end) {
        busy.back().end = e.end;
        busy.back().last = std::move(e.last);
      }
    } else {
      busy.push_back(std::move(e));
    }
  }
  return busy;
}

std::vector<IdleGap> IdleGaps(const std::vector<DeviceInterval>& busy, uint64_t min_ns) {
  std::vector<IdleGap> gaps;
  for (size_t i = 1; i < busy.size(); ++i) {
    const uint64_t ns = busy[i].start - busy[i - 1].end;
    if (ns >= min_ns) gaps.push_back({ns, busy[i - 1].last, busy[i].first});
  }
  return gaps;
}

}  // namespace step_loop
