#include "model/net/shared_slot_pools.h"

#include <utility>

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
  return own;
}

int SharedSlotPools::live() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [key, pool] : pools_) n += pool.expired() ? 0 : 1;
  return n;
}

}  // namespace txl
