// A barrier between the phases of one parallel region (a decode step runs
// all its layers in one region: waking the pool once per product cost more
// than a passive thread's wake-up could save; docs/PERFORMANCE.md).
//
// Deadlock-free whatever the region's size: the work is split into `parts`,
// each thread arrives once for all the parts it runs (at::parallel_for may
// hand one thread several, or, nested or without OpenMP, one thread all),
// and the barrier opens when every part has arrived. It spins briefly, then
// yields, so that a loaded machine's descheduled thread gets its core back.
#ifndef TXL_MODEL_TEAM_BARRIER_H_
#define TXL_MODEL_TEAM_BARRIER_H_

#include <atomic>
#include <cstdint>
#include <thread>

namespace txl {

class TeamBarrier {
 public:
  explicit TeamBarrier(int64_t parts) : parts_(parts) {}
  TeamBarrier(const TeamBarrier&) = delete;
  TeamBarrier& operator=(const TeamBarrier&) = delete;

  // Returns once all parts have arrived. What any thread wrote before it
  // arrived is visible to every thread after.
  void Arrive(int64_t parts) {
    const int64_t generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(parts, std::memory_order_acq_rel) + parts == parts_) {
      arrived_.store(0, std::memory_order_relaxed);  // before the release below
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation_.load(std::memory_order_acquire) == generation; ++spins) {
      if (spins < kSpins) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  static constexpr int kSpins = 4096;  // ~tens of microseconds: a phase's typical gap
  const int64_t parts_;
  std::atomic<int64_t> arrived_{0};
  std::atomic<int64_t> generation_{0};
};

}  // namespace txl

#endif  // TXL_MODEL_TEAM_BARRIER_H_
