// DefaultHostBudget: the CPU's default session budget (what the host has
// available less headroom and the other host-memory budgets), and the
// start-up error when nothing is left for one session.
#include "server/sessions/host_budget.h"

#include <cstdint>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace txl {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20, kGiB = int64_t{1} << 30;

HostBudgetConfig Config(int64_t available, int64_t total) {
  HostBudgetConfig c;
  c.memory = {total, available, "host"};
  c.checkpoints = 256 * kMiB;
  c.state_cache = 256 * kMiB;
  c.history = 250 * kMiB;
  c.window_bytes = 16384;
  c.default_mem_len = 32;
  return c;
}

TEST(HostBudgetTest, DefaultHeadroomIsATenthOfTheHost) {
  EXPECT_EQ(HostHeadroom(Config(20 * kGiB, 24 * kGiB)), 24 * kGiB / 10);
  HostBudgetConfig c = Config(20 * kGiB, 24 * kGiB);
  c.headroom = kGiB;
  EXPECT_EQ(HostHeadroom(c), kGiB);
}

TEST(HostBudgetTest, BudgetLeavesRoomForHeadroomAndTheOtherBudgets) {
  HostBudgetConfig c = Config(20 * kGiB, 24 * kGiB);
  EXPECT_EQ(*DefaultHostBudget(c), 20 * kGiB - 24 * kGiB / 10 - 762 * kMiB);
  c.offload = kGiB;
  EXPECT_EQ(*DefaultHostBudget(c), 19 * kGiB - 24 * kGiB / 10 - 762 * kMiB);
  // Exactly one window is enough to start.
  c = Config(0, 10 * kGiB);
  c.memory.available_bytes = kGiB + 762 * kMiB + 16384;
  EXPECT_EQ(*DefaultHostBudget(c), 16384);
}

// With a repository, what the model memory budget leaves for versions loaded
// later is set aside too, and named.
TEST(HostBudgetTest, WeightsOfLaterModelVersionsAreSetAside) {
  HostBudgetConfig c = Config(20 * kGiB, 24 * kGiB);
  const int64_t without = *DefaultHostBudget(c);
  c.later_versions = 5 * kGiB;
  EXPECT_EQ(*DefaultHostBudget(c), without - 5 * kGiB);
  EXPECT_THAT(DescribeHostBudget(c),
              testing::HasSubstr("5368709120 model versions loaded later (--model_memory_budget)"));
  c.later_versions = 20 * kGiB;
  EXPECT_THAT(DefaultHostBudget(c).status().message(), testing::HasSubstr("--model_memory_budget"));
}

// A base-shaped model's full window at mem_len 4096 is about 192 MiB (1,000
// of them: 187.5 GiB). On a 24 GiB host with 22 available, no limit let
// max_sessions (1000) of them in; the default admits what fits.
TEST(HostBudgetTest, ABaseShapedModelsLongWindowsFitTheHost) {
  HostBudgetConfig c = Config(22 * kGiB, 24 * kGiB);
  c.window_bytes = 192 * kMiB;
  const int64_t sessions = *DefaultHostBudget(c) / c.window_bytes;
  EXPECT_GT(sessions, 90);
  EXPECT_LT(sessions * c.window_bytes, 22 * kGiB);
}

TEST(HostBudgetTest, NoRoomForOneWindowStopsStartUpNamingTheFlags) {
  for (int64_t available : {int64_t{0}, kGiB, kGiB + 762 * kMiB + 16383}) {
    auto budget = DefaultHostBudget(Config(available, 10 * kGiB));
    ASSERT_FALSE(budget.ok()) << available;
    EXPECT_EQ(budget.status().code(), absl::StatusCode::kFailedPrecondition);
    for (const char* flag : {"--session_memory_budget", "--host_headroom", "--checkpoint_budget",
                             "--state_cache_budget", "--host_memory_budget", "--session_history_tokens"}) {
      EXPECT_THAT(budget.status().message(), ::testing::HasSubstr(flag));
    }
    EXPECT_THAT(budget.status().message(), ::testing::HasSubstr("16384 bytes at mem_len 32"));
  }
}

}  // namespace
}  // namespace txl
