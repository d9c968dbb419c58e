#include "server/sessions/state_cache.h"

#include <algorithm>
#include <utility>

#include "base/hash.h"

namespace txl {
namespace {

// The chain's value after each token: chain[i] stands for the scope and tokens[0, i).
std::vector<uint64_t> Chain(const std::string& scope, absl::Span<const int> tokens) {
  std::vector<uint64_t> chain(tokens.size() + 1);
  chain[0] = Hash64(scope.data(), scope.size());
  for (size_t i = 0; i < tokens.size(); ++i) chain[i + 1] = Hash64(&tokens[i], sizeof(int), chain[i]);
  return chain;
}

}  // namespace

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
    const bool leaves_one = length < static_cast<int64_t>(tokens.size()) || !e.state.pending.empty();
    const auto tail = tokens.subspan(length - e.check.size(), e.check.size());
    if (e.scope != scope || !leaves_one || !std::equal(tail.begin(), tail.end(), e.check.begin())) continue;
    order_.splice(order_.end(), order_, found->second);  // just used: evicted last
    ++stats_.hits;
    return e.state;
  }
  ++stats_.misses;
  return std::nullopt;
}

void StateCache::CountSaved(int64_t tokens) {
  absl::MutexLock lock(&mu_);
  stats_.tokens_saved += tokens;
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
