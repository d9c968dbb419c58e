#include "server/sessions/checkpoint_store.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace txl {
namespace {

int64_t Size(const std::shared_ptr<const std::string>& image) {
  return image ? static_cast<int64_t>(image->size()) : 0;
}

}  // namespace

void CheckpointStore::Put(const std::string& id, int64_t position, std::shared_ptr<const std::string> image,
                          std::vector<int> pending) {
  if (!WouldKeep(Size(image))) return;
  absl::MutexLock lock(&mu_);
  Add(id, position, Held{std::move(image), std::move(pending), ++tick_});
  Evict();
}

void CheckpointStore::Add(const std::string& id, int64_t position, Held held) {
  PerSession& mine = sessions_[id];
  if (auto old = mine.find(position); old != mine.end()) {
    bytes_ -= Size(old->second.image);
    --count_;
    mine.erase(old);
  }
  bytes_ += Size(held.image);
  ++count_;
  mine.emplace(position, std::move(held));
  // Past its own share, the session's least recently used goes.
  while (static_cast<int64_t>(mine.size()) > std::max<int64_t>(config_.per_session, 1)) {
    auto oldest = mine.begin();
    for (auto it = mine.begin(); it != mine.end(); ++it)
      if (it->second.used < oldest->second.used) oldest = it;
    Remove(sessions_.find(id), oldest);
  }
}

void CheckpointStore::Evict() {
  // Linear scans: the budget holds few images (each is a whole session's memory).
  while (bytes_ > config_.budget_bytes) {
    auto victim_session = sessions_.end();
    PerSession::iterator victim;
    for (auto s = sessions_.begin(); s != sessions_.end(); ++s) {
      for (auto it = s->second.begin(); it != s->second.end(); ++it) {
        if (victim_session == sessions_.end() || it->second.used < victim->second.used) {
          victim_session = s;
          victim = it;
        }
      }
    }
    if (victim_session == sessions_.end()) return;
    Remove(victim_session, victim);
  }
}

void CheckpointStore::Remove(absl::flat_hash_map<std::string, PerSession>::iterator it, PerSession::iterator at) {
  bytes_ -= Size(at->second.image);
  --count_;
  it->second.erase(at);
  if (it->second.empty()) sessions_.erase(it);
}

std::vector<TurnCheckpoint> CheckpointStore::Of(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  std::vector<TurnCheckpoint> out;
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return out;
  for (const auto& [position, held] : it->second) out.push_back({position, held.image, held.pending});
  return out;
}

void CheckpointStore::Touch(const std::string& id, int64_t position) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  if (auto at = it->second.find(position); at != it->second.end()) at->second.used = ++tick_;
}

void CheckpointStore::DropAfter(const std::string& id, int64_t position) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  while (!it->second.empty() && std::prev(it->second.end())->first > position) {
    const bool last = it->second.size() == 1;
    Remove(it, std::prev(it->second.end()));
    if (last) return;  // Remove erased the session
  }
}

void CheckpointStore::Drop(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  for (const auto& [position, held] : it->second) bytes_ -= Size(held.image);
  count_ -= static_cast<int64_t>(it->second.size());
  sessions_.erase(it);
}

void CheckpointStore::CopyUpTo(const std::string& from, const std::string& to, int64_t position) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(from);
  if (it == sessions_.end()) return;
  std::vector<std::pair<int64_t, Held>> taken;
  for (const auto& [at, held] : it->second)
    if (at <= position) taken.emplace_back(at, Held{held.image, held.pending, ++tick_});
  for (auto& [at, held] : taken) Add(to, at, std::move(held));  // may rehash: `it` is not used after
  Evict();
}

int64_t CheckpointStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

int64_t CheckpointStore::count() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

}  // namespace txl
