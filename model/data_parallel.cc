#include "model/data_parallel.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

}  // namespace

struct DataParallel::Group {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
};

DataParallel::DataParallel(int rank, int world) : rank_(rank), world_(world) {}
DataParallel::~DataParallel() = default;

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::FromEnvironment() {
  absl::StatusOr<int> world = EnvInt("WORLD_SIZE", 1, false);
  if (!world.ok()) return world.status();
  if (*world < 1) return absl::InvalidArgumentError(absl::StrCat("WORLD_SIZE=", *world, " must be >= 1"));
  auto dp = std::unique_ptr<DataParallel>(new DataParallel(0, *world));
  if (*world == 1) return dp;

  absl::StatusOr<int> rank = EnvInt("RANK", 0, true);
  if (!rank.ok()) return rank.status();
  if (*rank < 0 || *rank >= *world)
    return absl::InvalidArgumentError(absl::StrCat("RANK=", *rank, " is outside [0, WORLD_SIZE=", *world, ")"));
  absl::StatusOr<int> port = EnvInt("MASTER_PORT", 29500, false);
  if (!port.ok()) return port.status();
  if (*port < 1 || *port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("MASTER_PORT=", *port, " is not a port"));
  const char* addr = std::getenv("MASTER_ADDR");
  const std::string host = addr && *addr ? addr : "127.0.0.1";
  dp->rank_ = *rank;
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(*port);
    opts.isServer = *rank == 0;
    opts.numWorkers = static_cast<size_t>(*world);
    opts.timeout = std::chrono::seconds(120);
    auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
    dp->group_ = std::make_unique<Group>();
    dp->group_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, *rank, *world, options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("joining the process group at ", host, ":", *port,
                                               " as rank ", *rank, " of ", *world, ": ", e.what()));
  }
  return dp;
}

void DataParallel::AllReduceMean(const std::vector<at::Tensor>& tensors) {
  if (world_ == 1 || tensors.empty()) return;
  std::vector<at::Tensor> flat_list;
  for (const at::Tensor& t : tensors) flat_list.push_back(t.reshape({-1}));
  std::vector<at::Tensor> flat = {at::cat(flat_list)};
  group_->pg->allreduce(flat)->wait();
  flat[0].div_(world_);
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    t.copy_(flat[0].slice(0, offset, offset + t.numel()).view_as(t));
    offset += t.numel();
  }
}

void DataParallel::Broadcast(const std::vector<at::Tensor>& tensors) {
  if (world_ == 1) return;
  for (const at::Tensor& t : tensors) {
    std::vector<at::Tensor> one = {t};
    group_->pg->broadcast(one)->wait();
  }
}

}  // namespace txl
