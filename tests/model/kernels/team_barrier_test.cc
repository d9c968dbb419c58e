// TeamBarrier (model/kernels/team_barrier.h): threads standing for different numbers
// of parts meet at every phase, and see each other's writes after it.
#include "model/kernels/team_barrier.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace txl {
namespace {

TEST(TeamBarrierTest, UnevenPartsMeetAtEveryPhaseAndSeeEachOthersWrites) {
  const std::vector<int64_t> parts = {2, 1, 1};  // one thread runs two parts
  TeamBarrier barrier(4);
  constexpr int kPhases = 2000;
  std::vector<int> written(parts.size(), -1);  // plain ints: the barrier orders them
  std::vector<int> mismatches(parts.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < parts.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int phase = 0; phase < kPhases; ++phase) {
        written[t] = phase;
        barrier.Arrive(parts[t]);
        for (size_t o = 0; o < parts.size(); ++o) mismatches[t] += written[o] != phase;
        barrier.Arrive(parts[t]);  // nobody writes the next phase before all have read this one
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t t = 0; t < parts.size(); ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

TEST(TeamBarrierTest, OneCallerWithEveryPartPassesAtOnce) {
  TeamBarrier barrier(3);
  for (int i = 0; i < 3; ++i) barrier.Arrive(3);  // would never return if it waited for others
}

}  // namespace
}  // namespace txl
