#include "server/sessions/state_cache.h"

#include <algorithm>
#include <utility>

#include "base/hash.h"

namespace txl {

std::vector<uint64_t> StateCache::Chain(const std::string& scope, absl::Span<const int> tokens) {
  std::vector<uint64_t> chain(tokens.size() + 1);
  chain[0] = Hash64(scope.data(), scope.size());
  for (size_t i = 0; i < tokens.size(); ++i) chain[i + 1] = Hash64(&tokens[i], sizeof(int), chain[i]);
  return chain;
}

bool StateCache::Usable(absl::Span<const int> tokens, int64_t length, absl::Span<const int> check, size_t pending) {
  if (length <= 0 || length > static_cast<int64_t>(tokens.size()) || static_cast<int64_t>(check.size()) > length)
    return false;
  // At least one token left to feed: its pending one, or one after it.
  if (length == static_cast<int64_t>(tokens.size()) && pending == 0) return false;
  const auto tail = tokens.subspan(length - check.size(), check.size());
  return std::equal(tail.begin(), tail.end(), check.begin(), check.end());
}

int64_t StateCache::Entry::bytes() const {
  return static_cast<int64_t>((state.image ? state.image->size() : 0) +
                              (check.size() + state.pending.size()) * sizeof(int) + scope.size());
}

void StateCache::Put(const std::string& scope, absl::Span<const int> tokens, CachedState state, int64_t check) {
  if (!enabled() || !state.image || state.position != static_cast<int64_t>(tokens.size()) || tokens.empty()) return;
  Entry e;
  e.key = {Chain(scope, tokens).back(), state.position};
  e.scope = scope;
  const size_t keep = std::min(tokens.size(), static_cast<size_t>(std::max<int64_t>(check, 1)));
  e.check.assign(tokens.end() - keep, tokens.end());
  e.state = std::move(state);
  if (e.bytes() > config_.budget_bytes) return;  // never kept: it would evict everything else
  absl::MutexLock lock(&mu_);
  if (auto old = index_.find(e.key); old != index_.end()) Remove(old->second);
  stats_.bytes += e.bytes();
  ++stats_.entries;
  order_.push_back(std::move(e));
  index_[order_.back().key] = std::prev(order_.end());
  while (stats_.bytes > config_.budget_bytes && !order_.empty()) {
    Remove(order_.begin());
    ++stats_.evictions;
  }
}

std::optional<CachedState> StateCache::Longest(const std::string& scope, absl::Span<const int> tokens) {
  if (!enabled()) return std::nullopt;
  const std::vector<uint64_t> chain = Chain(scope, tokens);
  absl::MutexLock lock(&mu_);
  for (int64_t length = static_cast<int64_t>(tokens.size()); length > 0; --length) {
    auto found = index_.find(Key{chain[length], length});
    if (found == index_.end()) continue;
    const Entry& e = *found->second;
    if (e.scope != scope || !Usable(tokens, length, e.check, e.state.pending.size())) continue;
    order_.splice(order_.end(), order_, found->second);  // just used: evicted last
    return e.state;
  }
  return std::nullopt;
}

void StateCache::Count(CacheLookup result, int64_t tokens_saved) {
  absl::MutexLock lock(&mu_);
  switch (result) {
    case CacheLookup::kHit: ++stats_.hits; break;
    case CacheLookup::kStoreHit: ++stats_.store_hits; break;
    case CacheLookup::kMiss: ++stats_.misses; break;
  }
  stats_.tokens_saved += tokens_saved;
}

StateCacheStats StateCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void StateCache::Remove(Order::iterator it) {
  stats_.bytes -= it->bytes();
  --stats_.entries;
  index_.erase(it->key);
  order_.erase(it);
}

}  // namespace txl
