#include "server/sessions/token_history.h"

#include <algorithm>

namespace txl {

void TokenHistory::Append(const std::vector<int>& tokens, int64_t keep) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  if (keep <= 0) return;
  const int64_t over = static_cast<int64_t>(tokens_.size()) - keep;
  if (over <= 0) return;
  tokens_.erase(tokens_.begin(), tokens_.begin() + over);
  start_ += over;
}

void TokenHistory::Truncate(int64_t position) {
  if (position < start_) {  // nothing held is left; the history goes on from there
    tokens_.clear();
    start_ = std::max<int64_t>(position, 0);
    return;
  }
  const int64_t keep = std::clamp<int64_t>(position - start_, 0, static_cast<int64_t>(tokens_.size()));
  tokens_.resize(static_cast<size_t>(keep));
}

std::vector<int> TokenHistory::Slice(int64_t from, int64_t to) const {
  if (!Covers(from, to)) return {};
  return std::vector<int>(tokens_.begin() + (from - start_), tokens_.begin() + (to - start_));
}

TokenHistory TokenHistory::Prefix(int64_t position) const {
  TokenHistory out = *this;
  out.Truncate(position);
  return out;
}

}  // namespace txl
