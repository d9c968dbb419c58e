#include "train/data_parallel.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// Only a CUDA libtorch built with NCCL defines USE_C10D_NCCL (torch_cuda
// exports it to its users). The header needs CUDA's and NCCL's headers. The
// CMake option TXL_NCCL (train/CMakeLists.txt) decides what their absence
// means: AUTO, Gloo through host copies; ON, an error here; OFF, Gloo always.
#if defined(TXL_REQUIRE_NCCL) && !defined(USE_C10D_NCCL)
#error "TXL_NCCL=ON: this libtorch was built without NCCL (USE_C10D_NCCL is not defined)"
#endif
#if defined(USE_C10D_NCCL) && !defined(TXL_NO_NCCL) && defined(__has_include)
#if __has_include(<nccl.h>)
#define TXL_HAVE_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#endif
#if defined(TXL_REQUIRE_NCCL) && !defined(TXL_HAVE_NCCL)
#error "TXL_NCCL=ON: nccl.h is not on the include path"
#endif

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace txl {
namespace {

absl::StatusOr<int> EnvInt(const char* name, int fallback, bool required) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    if (required) return absl::InvalidArgumentError(absl::StrCat(name, " is not set"));
    return fallback;
  }
  int out;
  if (!absl::SimpleAtoi(value, &out))
    return absl::InvalidArgumentError(absl::StrCat(name, "='", value, "' is not an integer"));
  return out;
}

// Plain "cuda" -> cuda:LOCAL_RANK (LOCAL_RANK unset: rank % device count).
absl::StatusOr<at::Device> ResolveCudaDevice(const at::Device& device, int rank) {
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  if (count < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("device '", device.str(), "': no CUDA GPU is visible to this process"));
  }
  int64_t index = device.has_index() ? device.index() : -1;
  if (index < 0) {
    ASSIGN_OR_RETURN(const int local, EnvInt("LOCAL_RANK", -1, false));
    if (local >= 0) {
      if (local >= count) {
        return absl::InvalidArgumentError(
            absl::StrCat("LOCAL_RANK=", local, " but only ", count, " CUDA device(s) are visible"));
      }
      index = local;
    } else {
      index = rank % count;
    }
  }
  if (index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", device.str(), "' but only ", count, " CUDA device(s) are visible"));
  }
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

absl::StatusOr<at::Device> ParseTrainingDevice(const std::string& name, const std::string& flag) {
  std::optional<at::Device> device;
  try {
    device.emplace(name);
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": unknown device '", name, "' (use cpu, cuda or cuda:N)"));
  }
  if (!device->is_cpu() && !device->is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", name, "' is not supported (use cpu, cuda or cuda:N)"));
  }
  if (device->is_cuda()) {
    if (!at::hasCUDA()) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, ": '", name, "' asked for, but this libtorch build has no CUDA support (train on cpu)"));
    }
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    if (count < 1) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, ": '", name, "' asked for, but no CUDA GPU is visible to this process"));
    }
    if (device->has_index() && device->index() >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", name, "' but only ", count, " CUDA device(s) are visible"));
    }
  }
  return *device;
}

// What Gloo and NCCL are, by libtorch version: from 2.0 on they are
// c10d::Backend (a c10d::ProcessGroup wraps backends); before, each was a
// c10d::ProcessGroup itself. Both have the allreduce and broadcast used here.
#if TORCH_VERSION_MAJOR >= 2
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif

struct DataParallel::Group {
  c10::intrusive_ptr<Collectives> pg;
};

DataParallel::DataParallel(int rank, int world, at::Device device) : rank_(rank), world_(world), device_(device) {}
DataParallel::~DataParallel() = default;

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::FromEnvironment(const at::Device& device) {
  if (!device.is_cpu() && !device.is_cuda())
    return absl::InvalidArgumentError(absl::StrCat("device '", device.str(), "' is not supported"));
  ASSIGN_OR_RETURN(const int world, EnvInt("WORLD_SIZE", 1, false));
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("WORLD_SIZE=", world, " must be >= 1"));
  int rank_value = 0;
  if (world > 1) {
    ASSIGN_OR_RETURN(const int rank, EnvInt("RANK", 0, true));
    if (rank < 0 || rank >= world)
      return absl::InvalidArgumentError(absl::StrCat("RANK=", rank, " is outside [0, WORLD_SIZE=", world, ")"));
    rank_value = rank;
  }
  at::Device resolved = device;
  if (device.is_cuda()) {
    ASSIGN_OR_RETURN(resolved, ResolveCudaDevice(device, rank_value));
    try {
      // The current device, for whatever allocates without naming one
      // (NCCL's communicators and streams included).
      c10::impl::getDeviceGuardImpl(at::kCUDA)->setDevice(resolved);
    } catch (const c10::Error& e) {
      return absl::FailedPreconditionError(
          absl::StrCat("selecting ", resolved.str(), ": ", e.what_without_backtrace()));
    }
  } else {
    resolved = at::Device(at::kCPU);
  }
  auto dp = std::unique_ptr<DataParallel>(new DataParallel(0, world, resolved));
  if (world == 1) return dp;

  ASSIGN_OR_RETURN(const int port, EnvInt("MASTER_PORT", 29500, false));
  if (port < 1 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("MASTER_PORT=", port, " is not a port"));
  const char* addr = std::getenv("MASTER_ADDR");
  const std::string host = addr && *addr ? addr : "127.0.0.1";
  dp->rank_ = rank_value;
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(port);
    opts.isServer = rank_value == 0;
    opts.numWorkers = static_cast<size_t>(world);
    opts.timeout = std::chrono::seconds(120);
    auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
    dp->group_ = std::make_unique<Group>();
    auto gloo = [&]() {
      auto options = c10d::ProcessGroupGloo::Options::create();
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
      dp->group_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank_value, world, options);
    };
    if (resolved.is_cuda()) {
#if defined(TXL_HAVE_NCCL)
      dp->group_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank_value, world,
                                                                   c10d::ProcessGroupNCCL::Options::create());
      dp->backend_ = "nccl";
#else
      // No NCCL in this libtorch: Gloo on host copies of the device tensors.
      gloo();
      dp->backend_ = "gloo via host copies";
      dp->host_staging_ = true;
#endif
    } else {
      gloo();
      dp->backend_ = "gloo";
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("joining the process group at ", host, ":", port, " as rank ",
                                               rank_value, " of ", world, ": ", e.what()));
  }
  return dp;
}

void DataParallel::AllReduceMean(const std::vector<at::Tensor>& tensors) {
  if (world_ == 1 || tensors.empty()) return;
  std::vector<at::Tensor> flat_list;
  for (const at::Tensor& t : tensors) flat_list.push_back(t.reshape({-1}));
  // On CUDA with NCCL the buffer stays on the GPU; wait() orders the current
  // stream after the collective. Without NCCL it goes through host memory.
  const at::Tensor buffer = at::cat(flat_list);
  std::vector<at::Tensor> flat = {host_staging_ ? buffer.to(at::kCPU) : buffer};
  group_->pg->allreduce(flat)->wait();
  flat[0].div_(world_);
  const at::Tensor result = host_staging_ ? flat[0].to(buffer.device()) : flat[0];
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    t.copy_(result.slice(0, offset, offset + t.numel()).view_as(t));
    offset += t.numel();
  }
}

void DataParallel::Broadcast(const std::vector<at::Tensor>& tensors) {
  if (world_ == 1) return;
  for (const at::Tensor& t : tensors) {
    if (host_staging_) {
      std::vector<at::Tensor> one = {t.to(at::kCPU).contiguous()};
      group_->pg->broadcast(one)->wait();
      t.copy_(one[0]);
    } else {
      std::vector<at::Tensor> one = {t};
      group_->pg->broadcast(one)->wait();
    }
  }
}

}  // namespace txl
