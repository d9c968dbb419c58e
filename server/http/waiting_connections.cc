#include "server/http/waiting_connections.h"

#include <utility>

namespace txl {

WaitingConnections::Key WaitingConnections::Add(Evict evict) {
  absl::MutexLock lock(&mu_);
  const Key key = next_++;
  waiting_.emplace(key, std::move(evict));
  return key;
}

void WaitingConnections::Remove(Key key) {
  absl::MutexLock lock(&mu_);
  waiting_.erase(key);
}

bool WaitingConnections::EvictOldest() {
  Key key = 0;
  Evict evict;
  {
    absl::MutexLock lock(&mu_);
    if (waiting_.empty()) return false;
    auto oldest = waiting_.begin();
    key = oldest->first;
    evict = std::move(oldest->second);
    waiting_.erase(oldest);
  }
  evict(key);
  return true;
}

int64_t WaitingConnections::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(waiting_.size());
}

}  // namespace txl
