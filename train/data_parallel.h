// DataParallel: the process group of a data-parallel training run, set up
// from the torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, LOCAL_RANK), and the device this rank trains on.
// Backends: Gloo on CPU. On CUDA, NCCL when this libtorch was built with it
// (USE_C10D_NCCL, which a CUDA libtorch exports to its users); otherwise Gloo,
// with each collective's buffer copied to the host and back. A single process
// needs no group at all.
#ifndef TXL_TRAIN_DATA_PARALLEL_H_
#define TXL_TRAIN_DATA_PARALLEL_H_

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace txl {

// Parses and checks a training device: "cpu", "cuda" or "cuda:N".
// Unknown or unsupported names: INVALID_ARGUMENT naming them. CUDA when this
// libtorch has no CUDA support or no GPU is visible: FAILED_PRECONDITION
// saying which. "cuda:N" past the visible devices: INVALID_ARGUMENT.
// `flag` names the setting in messages (the caller's name for it, e.g. "device").
absl::StatusOr<at::Device> ParseTrainingDevice(const std::string& name, const std::string& flag = "device");

// Collective calls must be made by every rank in the same order.
class DataParallel {
 public:
  // World size 1 when WORLD_SIZE is unset. Fails with a message naming the
  // variable when the environment is incomplete or malformed. `device` (from
  // ParseTrainingDevice) is where this rank trains; plain "cuda" becomes
  // cuda:LOCAL_RANK (LOCAL_RANK unset: RANK % the visible device count), and
  // a CUDA device is made the current one.
  static absl::StatusOr<std::unique_ptr<DataParallel>> FromEnvironment(const at::Device& device = at::Device(at::kCPU));
  ~DataParallel();

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  // The device this rank trains on, with its index when it is a GPU.
  const at::Device& device() const { return device_; }
  // "none" (one process), "gloo", "nccl", or "gloo via host copies" (CUDA
  // tensors without NCCL in this libtorch).
  const std::string& backend() const { return backend_; }

  // Averages the tensors across ranks, in place (one flat allreduce). The
  // tensors live on device().
  void AllReduceMean(const std::vector<at::Tensor>& tensors);
  // Copies rank 0's tensors to every rank, in place.
  void Broadcast(const std::vector<at::Tensor>& tensors);

 private:
  struct Group;  // the c10d process group, kept out of this header
  DataParallel(int rank, int world, at::Device device);
  int rank_, world_;
  at::Device device_;
  std::string backend_ = "none";
  bool host_staging_ = false;  // collectives run on CPU copies of device tensors
  std::unique_ptr<Group> group_;
};

}  // namespace txl

#endif  // TXL_TRAIN_DATA_PARALLEL_H_
