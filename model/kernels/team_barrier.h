// A barrier between the phases of one parallel region (a one-session decode
// step runs all its layers in one region: waking the pool for every product
// cost more than the products; docs/OPTIMISATIONS.md, "One parallel region per
// one-session step").
//
// Deadlock-free whatever the region's size: the work is split into `parts`,
// each thread arrives once for all the parts it runs (at::parallel_for may
// hand one thread several, or, nested or without OpenMP, one thread all),
// and the barrier opens when every part has arrived.
//
// A waiting thread spins briefly (phases end within microseconds of each
// other on a quiet machine), then sleeps on a futex: on a loaded machine the
// sibling it waits for may be descheduled, and spinning or yielding would
// keep it from its core (both measured several times slower under load).
#ifndef TXL_MODEL_KERNELS_TEAM_BARRIER_H_
#define TXL_MODEL_KERNELS_TEAM_BARRIER_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace txl {

class TeamBarrier {
 public:
  explicit TeamBarrier(int64_t parts) : parts_(parts) {}
  TeamBarrier(const TeamBarrier&) = delete;
  TeamBarrier& operator=(const TeamBarrier&) = delete;

  // Returns once all parts have arrived. What any thread wrote before it
  // arrived is visible to every thread after.
  void Arrive(int64_t parts) {
    const int32_t generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(parts, std::memory_order_acq_rel) + parts == parts_) {
      arrived_.store(0, std::memory_order_relaxed);  // before the release below
      generation_.fetch_add(1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) Futex(FUTEX_WAKE_PRIVATE, INT32_MAX);
      return;
    }
    for (int spins = 0; spins < kSpins; ++spins) {
      if (generation_.load(std::memory_order_acquire) != generation) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    // Announce the sleep before the last look: the opener either sees a
    // sleeper and wakes, or this thread sees the new generation (or the
    // futex finds the value changed and returns at once).
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    while (generation_.load(std::memory_order_seq_cst) == generation) Futex(FUTEX_WAIT_PRIVATE, generation);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
  }

 private:
  static constexpr int kSpins = 2000;  // a few microseconds

  void Futex(int op, int32_t value) {
    syscall(SYS_futex, reinterpret_cast<int32_t*>(&generation_), op, value, nullptr, nullptr, 0);
  }

  const int64_t parts_;
  std::atomic<int64_t> arrived_{0};
  std::atomic<int32_t> generation_{0};  // a futex word
  std::atomic<int32_t> sleepers_{0};
  static_assert(sizeof(std::atomic<int32_t>) == sizeof(int32_t), "the futex word is the atomic's storage");
};

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_TEAM_BARRIER_H_
