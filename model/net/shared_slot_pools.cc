#include "model/net/shared_slot_pools.h"

#include <utility>

#include "model/net/pool_budget.h"
#include "model/net/slot_pool.h"

namespace txl {

std::shared_ptr<SlotPool> SharedSlotPools::Join(const Shape& shape, std::shared_ptr<SlotPool> own) {
  const Key key{shape.n_layer, shape.heads, shape.d_head, shape.dtype, shape.device};
  absl::MutexLock lock(&mu_);
  for (auto it = pools_.begin(); it != pools_.end();) {  // forget the pools nothing holds any more
    it = it->second.expired() ? pools_.erase(it) : std::next(it);
  }
  std::weak_ptr<SlotPool>& joined = pools_[key];
  if (std::shared_ptr<SlotPool> pool = joined.lock()) return pool;  // (it may have expired since the sweep)
  joined = own;
  if (budget_) own->CountAgainst(budget_, own);
  return own;
}

int SharedSlotPools::live() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [key, pool] : pools_) n += pool.expired() ? 0 : 1;
  return n;
}

void SharedSlotPools::Limit(const PoolBudgetConfig& budget) {
  absl::MutexLock lock(&mu_);
  budget_ = std::make_shared<PoolBudget>(budget);
  for (const auto& [key, weak] : pools_) {
    if (std::shared_ptr<SlotPool> pool = weak.lock()) pool->CountAgainst(budget_, pool);
  }
}

int64_t SharedSlotPools::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return budget_ ? budget_->held() : 0;
}

}  // namespace txl
