// A profile's device timeline (bench/device_timeline.h): overlapping and
// touching kernels merge, and the gaps between what is left are where the
// device waited, named by the kernels on either side.
#include "bench/device_timeline.h"

#include <gtest/gtest.h>

#include <vector>

namespace step_loop {
namespace {

TEST(DeviceTimelineTest, MergesOverlapsAndFindsTheGapsBetween) {
  // Out of order: b overlaps a, c touches b, d inside c; then e after a gap
  // of 10, f after one of 3.
  const std::vector<DeviceInterval> events = {{30, 40, "c", "c"}, {0, 10, "a", "a"},  {5, 30, "b", "b"},
                                              {32, 35, "d", "d"}, {50, 60, "e", "e"}, {63, 70, "f", "f"}};
  const std::vector<DeviceInterval> busy = BusyIntervals(events);
  ASSERT_EQ(busy.size(), 3u);
  EXPECT_EQ(busy[0].start, 0u);
  EXPECT_EQ(busy[0].end, 40u);
  EXPECT_EQ(busy[0].first, "a");
  EXPECT_EQ(busy[0].last, "c") << "d ends inside c: c closes the interval";
  EXPECT_EQ(busy[1].start, 50u);
  EXPECT_EQ(busy[2].end, 70u);

  const std::vector<IdleGap> all = IdleGaps(busy, 0);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].ns, 10u);
  EXPECT_EQ(all[0].before, "c");
  EXPECT_EQ(all[0].after, "e");
  EXPECT_EQ(all[1].ns, 3u);
  const std::vector<IdleGap> long_ones = IdleGaps(busy, 5);
  ASSERT_EQ(long_ones.size(), 1u);
  EXPECT_EQ(long_ones[0].after, "e");
}

TEST(DeviceTimelineTest, NoEventsNoIntervals) {
  EXPECT_TRUE(BusyIntervals({}).empty());
  EXPECT_TRUE(IdleGaps({}, 0).empty());
}

}  // namespace
}  // namespace step_loop
