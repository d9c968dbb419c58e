// DefaultDeviceBudget: the GPU's default session budget, and the start-up
// error when the device has no room left for one session.
#include "server/sessions/device_budget.h"

#include <cstdint>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace txl {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

DeviceBudgetConfig Config(int64_t free, int64_t total, int64_t headroom = 0) {
  DeviceBudgetConfig c;
  c.device = "cuda:0";
  c.memory = {free, total};
  c.headroom = headroom;
  c.window_bytes = 16384;
  c.default_mem_len = 32;
  return c;
}

TEST(DeviceBudgetTest, DefaultHeadroomIsATenthOfTheDeviceAndAtLeastOneGiB) {
  EXPECT_EQ(DeviceHeadroom(Config(100 * kGiB, 140 * kGiB)), 14 * kGiB);
  EXPECT_EQ(DeviceHeadroom(Config(4 * kGiB, 8 * kGiB)), kGiB);
  EXPECT_EQ(DeviceHeadroom(Config(4 * kGiB, 8 * kGiB, 3 * kGiB)), 3 * kGiB);
}

TEST(DeviceBudgetTest, BudgetIsWhatIsFreeLessTheHeadroom) {
  EXPECT_EQ(*DefaultDeviceBudget(Config(100 * kGiB, 140 * kGiB)), 86 * kGiB);
  EXPECT_EQ(*DefaultDeviceBudget(Config(4 * kGiB, 8 * kGiB, kGiB / 2)), 4 * kGiB - kGiB / 2);
  // Exactly one window is enough to start.
  EXPECT_EQ(*DefaultDeviceBudget(Config(kGiB + 16384, 8 * kGiB)), 16384);
}

TEST(DeviceBudgetTest, WeightsOfLaterModelVersionsAreSetAside) {
  DeviceBudgetConfig c = Config(100 * kGiB, 140 * kGiB);
  c.later_versions = 10 * kGiB;
  EXPECT_EQ(*DefaultDeviceBudget(c), 76 * kGiB);
  c.later_versions = 86 * kGiB;
  auto none = DefaultDeviceBudget(c);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(),
              testing::HasSubstr("92341796864 for model versions loaded later (--model_memory_budget)"));
}

// Regression: a second server on a GPU that the first one's pool already
// filled got a budget of 1 byte, started, and refused every session with
// RESOURCE_EXHAUSTED ("session_memory_budget=1 bytes").
TEST(DeviceBudgetTest, NoRoomForOneWindowStopsStartUpNamingTheFlags) {
  for (int64_t free : {int64_t{0}, 14 * kGiB, 14 * kGiB + 16383}) {
    auto budget = DefaultDeviceBudget(Config(free, 140 * kGiB));
    ASSERT_FALSE(budget.ok()) << free;
    EXPECT_EQ(budget.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(budget.status().message(), ::testing::HasSubstr("--session_memory_budget"));
    EXPECT_THAT(budget.status().message(), ::testing::HasSubstr("--gpu_headroom"));
    EXPECT_THAT(budget.status().message(), ::testing::HasSubstr("cuda:0 has"));
    EXPECT_THAT(budget.status().message(), ::testing::HasSubstr("16384 bytes at mem_len 32"));
  }
}

}  // namespace
}  // namespace txl
