// SharedSlotPools: the generic path's session pools (slot_pool.h) that the
// models of one process share, one per pool shape. A repository's versions
// of one architecture then hold their sessions' memory in one pool, which a
// GPU sizes once for the whole session budget, instead of one pool each
// (docs/OPERATIONS.md, "Model repository"). With a limit (Limit), the
// pools of every shape hold their rows within one budget (pool_budget.h).
//
// Torch-free, so that the server can make one and hand it to every load
// (LanguageModelOptions::shared_pools). A pool is shared only by models
// driven from one thread (the engine thread): SlotPool's Take and growth
// are that thread's.
#ifndef TXL_MODEL_NET_SHARED_SLOT_POOLS_H_
#define TXL_MODEL_NET_SHARED_SLOT_POOLS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "model/net/pool_budget.h"

namespace txl {

class SlotPool;

class SharedSlotPools {
 public:
  // What makes two models' pool rows interchangeable.
  struct Shape {
    int64_t n_layer = 0;
    int64_t heads = 0;
    int64_t d_head = 0;
    int dtype = 0;       // the keys' and values' element type (c10::ScalarType)
    std::string device;  // "cpu", "cuda:0", ...
  };

  // The pool of `shape`: the one joined before, while any model or session
  // still holds it; otherwise `own`, which becomes the shape's pool.
  std::shared_ptr<SlotPool> Join(const Shape& shape, std::shared_ptr<SlotPool> own);
  // Pools some model or session still holds.
  int live() const;
  // Counts every pool, those live now and those joined later, against
  // one budget together (the session memory budget), set before the engine
  // thread starts. A later call replaces it.
  void Limit(const PoolBudgetConfig& budget);
  // What the pools hold against the limit (0 without one).
  int64_t held_bytes() const;

 private:
  using Key = std::tuple<int64_t, int64_t, int64_t, int, std::string>;
  mutable absl::Mutex mu_;
  std::map<Key, std::weak_ptr<SlotPool>> pools_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<PoolBudget> budget_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_MODEL_NET_SHARED_SLOT_POOLS_H_
