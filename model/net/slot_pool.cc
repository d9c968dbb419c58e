#include "model/net/slot_pool.h"

#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "model/net/pool_budget.h"

namespace txl {

SlotPool::SlotPool(int64_t n_layer, int64_t heads, int64_t d_head, const at::TensorOptions& options)
    : heads_(heads), d_head_(d_head), options_(options), k_(n_layer), v_(n_layer) {
  Grow(64, 64, Admitted::kYes);
  absl::MutexLock lock(&mu_);
  free_.erase(free_.begin(), free_.lower_bound(kReservedRows));
}

SlotPool::~SlotPool() {
  if (budget_) budget_->Return(held_bytes());
}

void SlotPool::CountAgainst(std::shared_ptr<PoolBudget> budget, const std::shared_ptr<SlotPool>& self) {
  if (budget_) budget_->Return(held_bytes());
  budget->Count(self, held_bytes());
  budget_ = std::move(budget);
}

void SlotPool::Grow(int64_t rows, int64_t at_least, Admitted use) {
  int64_t granted = 0;
  if (budget_) {
    const int64_t per = id_bytes();
    const absl::StatusOr<int64_t> bytes =
        budget_->Grant(this, (rows - rows_) * per, (at_least - rows_) * per, use == Admitted::kYes);
    TORCH_CHECK_WITH(OutOfMemoryError, bytes.ok(), bytes.status().message());
    rows = rows_ + *bytes / per;
    granted = (rows - rows_) * per;
    budget_->Return(*bytes - granted);  // whole rows only
    if (rows <= rows_) return;
  }
  // Normal tensors even when a step (under InferenceMode) grows the pool:
  // forks and imports write rows outside any step, which inference tensors
  // refuse. One tensor at a time, so the old and new pools are not both
  // held whole; a tensor replaced before a failure is only larger than
  // rows_, which nothing reads past.
  c10::InferenceMode normal_tensors(false);
  try {
    for (std::vector<at::Tensor>* pool : {&k_, &v_}) {
      for (at::Tensor& t : *pool) {
        at::Tensor grown = at::zeros({rows, heads_, d_head_}, options_);
        if (rows_ > 0) grown.slice(0, 0, rows_).copy_(t.slice(0, 0, rows_));
        t = grown;
      }
    }
  } catch (...) {
    if (budget_) budget_->Return(granted);
    ++generation_;
    throw;
  }
  ++generation_;
  absl::MutexLock lock(&mu_);
  for (int64_t r = rows_; r < rows; ++r) free_.insert(free_.end(), r);
  rows_ = rows;
}

std::vector<int64_t> SlotPool::Take(int64_t n, Admitted use) {
  if (n <= 0) return {};
  if (const int64_t free = free_rows(); free < n) Grow(std::max(2 * rows_, rows_ + n), rows_ + n - free, use);
  std::vector<int64_t> taken;
  {
    absl::MutexLock lock(&mu_);
    auto end = free_.begin();
    std::advance(end, n);
    taken.assign(free_.begin(), end);  // the lowest: free rows gather at the top
    free_.erase(free_.begin(), end);
  }
  try {
    const at::Tensor ids = at::tensor(taken, at::TensorOptions().dtype(at::kLong)).to(options_.device());
    for (std::vector<at::Tensor>* pool : {&k_, &v_}) {
      for (at::Tensor& t : *pool) t.index_fill_(0, ids, 0);
    }
  } catch (...) {
    Give(taken);
    throw;
  }
  return taken;
}

void SlotPool::Reserve(int64_t rows) {
  if (rows > rows_) Grow(rows, rows_, Admitted::kYes);
}

int64_t SlotPool::Trim(int64_t bytes) {
  const int64_t per = id_bytes();
  int64_t drop = 0;
  {
    // Only Take (this thread) takes rows: the free top is not held, and
    // leaves the free list before the tensors shrink.
    absl::MutexLock lock(&mu_);
    int64_t top = 0;
    for (auto it = free_.rbegin(); it != free_.rend() && *it == rows_ - 1 - top; ++it) ++top;
    drop = std::min(top, std::max((bytes + per - 1) / per, top / 2));
    if (drop <= 0) return 0;
    rows_ -= drop;
    free_.erase(free_.lower_bound(rows_), free_.end());
  }
  if (budget_) budget_->Return(drop * per);
  // One tensor at a time, so that a trim needs one layer's kept rows beside
  // the pool, not the whole pool's. Where the device cannot make even that
  // (c10::OutOfMemoryError, to the step that asked), the rest stay larger
  // than rows_ (nothing reads past it) until the pool next grows or is trimmed.
  c10::InferenceMode normal_tensors(false);
  ++generation_;
  for (std::vector<at::Tensor>* pool : {&k_, &v_}) {
    for (at::Tensor& t : *pool) {
      if (t.size(0) > rows_) t = t.slice(0, 0, rows_).clone();
    }
  }
  return drop * per;
}

void SlotPool::Give(absl::Span<const int64_t> rows) {
  absl::MutexLock lock(&mu_);
  free_.insert(rows.begin(), rows.end());
}

int64_t SlotPool::free_rows() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

}  // namespace txl
