#include "model/net/pool_budget.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/net/slot_pool.h"

namespace txl {

void PoolBudget::Count(const std::shared_ptr<SlotPool>& pool, int64_t held) {
  absl::MutexLock lock(&mu_);
  pools_.push_back(pool);
  held_ += held;
}

absl::StatusOr<int64_t> PoolBudget::Grant(const SlotPool* pool, int64_t want, int64_t need, bool admitted) {
  want = std::max(want, need);
  std::vector<std::shared_ptr<SlotPool>> others;
  int64_t room = 0;
  {
    absl::MutexLock lock(&mu_);
    room = config_.limit_bytes - held_;
    if (need <= 0) {  // a reservation: what there is room for, trimming nothing
      const int64_t granted = std::clamp<int64_t>(room, 0, want);
      held_ += granted;
      return granted;
    }
    if (room < need) {
      for (auto it = pools_.begin(); it != pools_.end();) {
        std::shared_ptr<SlotPool> other = it->lock();
        if (other == nullptr) {
          it = pools_.erase(it);
          continue;
        }
        if (other.get() != pool) others.push_back(std::move(other));
        ++it;
      }
    }
  }
  // Trimmed unlocked: Trim returns what it frees (Return). Each pool gives
  // what is short, or half its free top if that is more, so that a pool
  // reserved for the whole budget is not trimmed again at every growth of
  // another shape's.
  int64_t trimmed = 0;
  for (const std::shared_ptr<SlotPool>& other : others) {
    if (room + trimmed >= need) break;
    trimmed += other->Trim(need - room - trimmed);
  }
  others.clear();  // (a pool whose last holder went meanwhile returns its bytes here)
  absl::MutexLock lock(&mu_);
  room = config_.limit_bytes - held_;
  if (room < need && !admitted && !config_.grow_past) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session memory pools: a copy or a rebuild needs ", need, " more bytes, but the pools hold ", held_,
        " of their ", config_.limit_bytes, "-byte budget (--session_memory_budget) and the other pools gave ", trimmed,
        " from their free tops"));
  }
  const int64_t granted = std::max(need, std::min(want, room));  // (room >= need unless past the limit)
  held_ += granted;
  return granted;
}

void PoolBudget::Return(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  held_ -= bytes;
}

int64_t PoolBudget::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

}  // namespace txl
