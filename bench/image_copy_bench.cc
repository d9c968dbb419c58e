// The engine thread's cost of a turn checkpoint's copy (JobRunner::Checkpoint):
// `--images` images of `--mib` each, kept alive as the checkpoint store keeps
// them while its budget fills, copied into fresh buffers and into buffers
// from ImageBuffers' stock, with the server's malloc settings. Prints the
// median copy, taking the buffer included, each way. Figures: docs/SESSIONS.md,
// "Turn checkpoints".
#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "base/malloc_tuning.h"
#include "server/sessions/image_buffers.h"

ABSL_FLAG(double, mib, 8.4, "bytes of one image, in MiB (8.4: a session of the 110 MB model of bench/reload.py)");
ABSL_FLAG(int, images, 30, "images copied each way (all kept, as a filling checkpoint budget keeps them)");

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (auto tuned = txl::TuneMalloc({}); !tuned.ok()) {
    std::cerr << "image_copy_bench: " << tuned << "\n";
    return 1;
  }
  const auto bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_mib) * (1 << 20));
  const int n = absl::GetFlag(FLAGS_images);
  if (bytes < 1 || n < 1) {
    std::cerr << "image_copy_bench: --mib and --images must be positive\n";
    return 2;
  }
  const std::string memory(static_cast<size_t>(bytes), 'k');
  auto buffers = txl::ImageBuffers::Create({});
  if (!buffers.ok()) return 1;
  std::vector<std::shared_ptr<std::string>> kept;
  auto copy = [&](bool stocked) {
    const auto start = std::chrono::steady_clock::now();
    auto image = std::make_shared<std::string>(stocked ? (*buffers)->Take(bytes) : std::string());
    image->reserve(static_cast<size_t>(bytes));
    image->append(memory);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    kept.push_back(std::move(image));
    return ms;
  };
  std::vector<double> fresh, stocked;
  for (int i = 0; i < n; ++i) fresh.push_back(copy(false));
  for (int i = 0; i < n; ++i) {
    // Turns end some steps apart: the stock refills meanwhile.
    (*buffers)->AwaitStock(1, bytes, absl::Seconds(10));
    stocked.push_back(copy(true));
  }
  std::cout << absl::StrFormat("image %.1f MiB, %d each way: median copy %.3f ms into fresh pages, %.3f ms stocked\n",
                               absl::GetFlag(FLAGS_mib), n, Median(fresh), Median(stocked));
  return 0;
}
