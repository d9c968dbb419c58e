#include "model/net/slot_pool.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>

namespace txl {

SlotPool::SlotPool(int64_t n_layer, int64_t heads, int64_t d_head, const at::TensorOptions& options)
    : heads_(heads), d_head_(d_head), options_(options), k_(n_layer), v_(n_layer) {
  Grow(64);
  absl::MutexLock lock(&mu_);
  free_.erase(std::remove_if(free_.begin(), free_.end(), [](int64_t r) { return r < kReservedRows; }), free_.end());
}

void SlotPool::Grow(int64_t rows) {
  // Normal tensors even when a step (under InferenceMode) grows the pool:
  // forks and imports write rows outside any step, which inference tensors
  // refuse.
  c10::InferenceMode normal_tensors(false);
  for (std::vector<at::Tensor>* pool : {&k_, &v_}) {
    for (at::Tensor& t : *pool) {
      at::Tensor grown = at::zeros({rows, heads_, d_head_}, options_);
      if (rows_ > 0) grown.slice(0, 0, rows_).copy_(t);
      t = grown;
    }
  }
  ++generation_;
  absl::MutexLock lock(&mu_);
  // Handed out from the back: the lowest ids first.
  for (int64_t r = rows - 1; r >= rows_; --r) free_.push_back(r);
  rows_ = rows;
}

std::vector<int64_t> SlotPool::Take(int64_t n) {
  if (n <= 0) return {};
  if (free_rows() < n) Grow(std::max(2 * rows_, rows_ + n));
  std::vector<int64_t> taken;
  {
    absl::MutexLock lock(&mu_);
    taken.assign(free_.end() - n, free_.end());
    free_.resize(free_.size() - n);
  }
  std::reverse(taken.begin(), taken.end());
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
  if (rows > rows_) Grow(rows);
}

void SlotPool::Give(absl::Span<const int64_t> rows) {
  absl::MutexLock lock(&mu_);
  free_.insert(free_.end(), rows.rbegin(), rows.rend());
}

int64_t SlotPool::free_rows() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

}  // namespace txl
