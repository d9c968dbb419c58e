// PoolBudget: the bytes that the session pools of a process (slot_pool.h)
// may hold together, so that a repository's architectures, each with a pool
// of its own shape, stay within one session memory budget on a device
// (docs/MODEL.md, "Pools of several shapes").
//
// A pool asks before it grows (Grant). When the room left is short, the
// budget takes it from the other pools' free tops (SlotPool::Trim), and
// refuses, naming the figures, when even that is not enough.
//
// Torch-free. Grant trims other pools, so it runs on the engine thread (the
// one that steps every pool) or before that thread starts; Return may come
// from any thread (a pool freed with its last holder).
#ifndef TXL_MODEL_NET_POOL_BUDGET_H_
#define TXL_MODEL_NET_POOL_BUDGET_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace txl {

class SlotPool;

class PoolBudget {
 public:
  explicit PoolBudget(int64_t limit_bytes) : limit_(limit_bytes) {}

  // Counts `held` bytes of `pool` from now on, over the limit or not (a
  // pool made before the budget was set).
  void Count(const std::shared_ptr<SlotPool>& pool, int64_t held);
  // Between `need` and `want` more bytes for `pool`, trimming the other
  // pools' free tops when the room left is under `need`; RESOURCE_EXHAUSTED
  // when they cannot make it. With `need` 0 (a reservation), what room there
  // is, up to `want`, trimming nothing.
  absl::StatusOr<int64_t> Grant(const SlotPool* pool, int64_t want, int64_t need);
  void Return(int64_t bytes);

  int64_t limit() const { return limit_; }
  int64_t held() const;

 private:
  const int64_t limit_;
  mutable absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::weak_ptr<SlotPool>> pools_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_MODEL_NET_POOL_BUDGET_H_
