#include "server/sessions/image_buffers.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace txl {

absl::StatusOr<std::unique_ptr<ImageBuffers>> ImageBuffers::Create(const ImageBuffersConfig& config) {
  if (config.stock < 1) return absl::InvalidArgumentError(absl::StrCat("image buffers: stock ", config.stock, " < 1"));
  if (config.max_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("image buffers: max_bytes ", config.max_bytes, " < 1"));
  }
  std::unique_ptr<ImageBuffers> b(new ImageBuffers(config));
  b->thread_ = std::thread([p = b.get()] { p->Loop(); });
  return b;
}

ImageBuffers::~ImageBuffers() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

int ImageBuffers::Target() const {
  if (want_bytes_ <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(config_.stock, config_.max_bytes / want_bytes_));
}

namespace {
// Whether `s` holds an image of `bytes` without holding much more: the
// checkpoint budget counts an image's size, not its capacity.
bool Fits(const std::string& s, int64_t bytes) {
  const auto room = static_cast<int64_t>(s.capacity());
  return room >= bytes && room <= bytes + bytes / 4;
}
}  // namespace

std::string ImageBuffers::Take(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  want_bytes_ = bytes;
  // The smallest ready buffer that fits.
  auto best = ready_.end();
  for (auto it = ready_.begin(); it != ready_.end(); ++it) {
    if (Fits(*it, bytes) && (best == ready_.end() || it->capacity() < best->capacity())) best = it;
  }
  if (best == ready_.end()) return std::string();
  std::string out = std::move(*best);
  ready_.erase(best);
  return out;
}

void ImageBuffers::Loop() {
  for (;;) {
    int64_t bytes = 0;
    {
      absl::MutexLock lock(&mu_);
      // Work: a buffer short of the target at the size asked for last, or
      // ones of another size to drop (a stock of the old size is of no use).
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_) return true;
        int fit = 0;
        for (const std::string& s : ready_) fit += Fits(s, want_bytes_);
        return fit < Target() || fit < static_cast<int>(ready_.size());
      };
      mu_.Await(absl::Condition(&work));
      if (stopping_) return;
      ready_.erase(std::remove_if(ready_.begin(), ready_.end(),
                                  [this](const std::string& s)
                                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !Fits(s, want_bytes_); }),
                   ready_.end());
      if (static_cast<int>(ready_.size()) >= Target()) continue;
      bytes = want_bytes_;
    }
    // Outside the lock: allocate and touch every page, then keep the room.
    std::string s;
    s.resize(static_cast<size_t>(bytes));
    s.clear();
    absl::MutexLock lock(&mu_);
    ready_.push_back(std::move(s));
  }
}

bool ImageBuffers::AwaitStock(int count, int64_t bytes, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto stocked = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int n = 0;
    for (const std::string& s : ready_) n += static_cast<int64_t>(s.capacity()) >= bytes;
    return n >= count;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&stocked), timeout);
}

int ImageBuffers::ready() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(ready_.size());
}

}  // namespace txl
