// DataParallel: the process group of a data-parallel training run, set up
// from the torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT). Gloo on CPU; a single process needs no group at all.
#ifndef TXL_MODEL_DATA_PARALLEL_H_
#define TXL_MODEL_DATA_PARALLEL_H_

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace txl {

// Collective calls must be made by every rank in the same order.
class DataParallel {
 public:
  // World size 1 when WORLD_SIZE is unset. Fails with a message naming the
  // variable when the environment is incomplete or malformed.
  static absl::StatusOr<std::unique_ptr<DataParallel>> FromEnvironment();
  ~DataParallel();

  int rank() const { return rank_; }
  int world_size() const { return world_; }

  // Averages the tensors across ranks, in place (one flat allreduce).
  void AllReduceMean(const std::vector<at::Tensor>& tensors);
  // Copies rank 0's tensors to every rank, in place.
  void Broadcast(const std::vector<at::Tensor>& tensors);

 private:
  struct Group;  // the c10d process group, kept out of this header
  DataParallel(int rank, int world);
  int rank_, world_;
  std::unique_ptr<Group> group_;
};

}  // namespace txl

#endif  // TXL_MODEL_DATA_PARALLEL_H_
