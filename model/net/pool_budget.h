// PoolBudget: the bytes that the session pools of a process (slot_pool.h)
// may hold together, so that a repository's architectures, each with a pool
// of its own shape, stay within one session memory budget on a device
// (docs/MODEL.md, "Pools of several shapes").
//
// A pool asks before it grows (Grant). When the room left is short, the
// budget takes it from the other pools' free tops (SlotPool::Trim). When even
// that is not enough, it grants what is needed past the limit for rows that
// admission has counted (a session's own window: failing its step would
// break admission's promise), and refuses a copy, naming the figures. Where
// session offload lets the sessions in flight pass the budget (grow_past),
// it refuses nothing.
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

struct PoolBudgetConfig {
  int64_t limit_bytes = 0;
  // Past the limit, once the other pools' free tops are taken: grant only
  // what is needed (session offload admits sessions past the budget, and
  // moves idle ones out after the step), instead of refusing (admission
  // keeps the sessions within it).
  bool grow_past = false;
};

class PoolBudget {
 public:
  explicit PoolBudget(const PoolBudgetConfig& config) : config_(config) {}

  // Counts `held` bytes of `pool` from now on, over the limit or not (a
  // pool made before the budget was set).
  void Count(const std::shared_ptr<SlotPool>& pool, int64_t held);
  // Between `need` and `want` more bytes for `pool`, trimming the other
  // pools' free tops when the room left is under `need`. When they cannot
  // make it: `need`, past the limit, for an `admitted` session's rows or with
  // grow_past; RESOURCE_EXHAUSTED otherwise. With `need` 0 (a reservation),
  // what room there is, up to `want`, trimming nothing.
  absl::StatusOr<int64_t> Grant(const SlotPool* pool, int64_t want, int64_t need, bool admitted);
  void Return(int64_t bytes);

  int64_t limit() const { return config_.limit_bytes; }
  int64_t held() const;

 private:
  const PoolBudgetConfig config_;
  mutable absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::weak_ptr<SlotPool>> pools_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_MODEL_NET_POOL_BUDGET_H_
