// The generic path's session memory (docs/MODEL.md, "The generic path"):
// one pool of rows per layer for keys and one for values, [rows, H,
// dh] each, shared by every session of a model. A session holds row ids, one
// per ring slot, the same in every layer, so a step gathers every session's
// keys of a layer with one indexed op and writes the new ones with another.
//
// Rows are handed out lowest first, so that the free rows gather at the
// top, where Trim can give them back.
//
// Threading: Take, Grow, Trim and the tensors belong to the engine thread
// (the one that drives the model); Give may come from any thread (a session
// freed where its last owner let go), so the free list has its own lock.
#ifndef TXL_MODEL_NET_SLOT_POOL_H_
#define TXL_MODEL_NET_SLOT_POOL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace txl {

class PoolBudget;

class SlotPool {
 public:
  // Row 0 is the padding row: zeros, never handed out, gathered where a
  // padded score column reads a key that the mask then drops. Row 1 is the
  // discard row, never handed out either and never gathered: a bucketed
  // decode step (decode_graphs.h) writes its padding sessions' keys there.
  static constexpr int64_t kPadRow = 0;
  static constexpr int64_t kDiscardRow = 1;
  static constexpr int64_t kReservedRows = 2;

  SlotPool(int64_t n_layer, int64_t heads, int64_t d_head, const at::TensorOptions& options);
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;
  ~SlotPool();

  // Whether admission has counted what the rows are for. A session's own
  // window (kYes) has been, so the budget grants its rows past the limit
  // rather than fail an admitted session's step. A copy
  // (SessionMemory::Copy: a Score that does not commit, a fork's or a
  // choice's copy) or a state rebuilt beside a session (StepInput::uncounted)
  // has not (kNo), and is refused there (docs/MODEL.md, "Pools of several
  // shapes").
  enum class Admitted { kYes, kNo };

  // `n` rows, zeroed in every layer (a row may have held another session's
  // keys: images copy every slot). Grows the pool, keeping its contents, when
  // too few are free; throws c10::OutOfMemoryError when the device is out of
  // memory or the budget refuses.
  std::vector<int64_t> Take(int64_t n, Admitted use);
  void Give(absl::Span<const int64_t> rows);
  // Grows the pool to `rows` rows now (start-up, outside any step), or as
  // near as its budget allows, so that steps within that many never grow it:
  // a GPU sizes its pool from the session memory budget, and admission keeps
  // sessions within it.
  void Reserve(int64_t rows);
  // Gives back free rows from the top: at least `bytes` where the free top
  // holds them, and at least half of that top. Returns the bytes freed.
  int64_t Trim(int64_t bytes);
  // Counts this pool's rows against `budget` from now on (SharedSlotPools::Limit).
  void CountAgainst(std::shared_ptr<PoolBudget> budget, const std::shared_ptr<SlotPool>& self);

  at::Tensor& keys(int64_t layer) { return k_[layer]; }  // [rows, H, dh]
  at::Tensor& values(int64_t layer) { return v_[layer]; }
  int64_t row_bytes() const { return heads_ * d_head_ * static_cast<int64_t>(options_.dtype().itemsize()); }
  int64_t heads() const { return heads_; }
  int64_t d_head() const { return d_head_; }
  int64_t rows() const { return rows_; }  // allocated, free or not
  // What one row id holds: keys and values of every layer.
  int64_t id_bytes() const { return 2 * static_cast<int64_t>(k_.size()) * row_bytes(); }
  // What a budget counts: every row but the padding and discard ones.
  int64_t held_bytes() const { return (rows_ - kReservedRows) * id_bytes(); }
  // Counts the times the tensors were replaced by larger ones (a captured
  // step that holds their addresses is stale once it changes).
  int64_t generation() const { return generation_; }
  int64_t free_rows() const;

 private:
  // To `rows` rows, or fewer but at least `at_least` where the budget says so.
  void Grow(int64_t rows, int64_t at_least, Admitted use);

  const int64_t heads_, d_head_;
  const at::TensorOptions options_;
  int64_t rows_ = 0;
  int64_t generation_ = 0;
  std::vector<at::Tensor> k_, v_;
  std::shared_ptr<PoolBudget> budget_;
  mutable absl::Mutex mu_;
  absl::btree_set<int64_t> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_MODEL_NET_SLOT_POOL_H_
