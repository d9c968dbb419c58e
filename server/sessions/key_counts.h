// KeyCounts: live sessions per key (a principal, a model's name), with no
// entry for a key at zero, so that a map holds only keys with sessions, not
// every principal or model that ever had one. Not thread-safe: its owner's
// lock guards it (SessionTable::mu_).
#ifndef TXL_SERVER_SESSIONS_KEY_COUNTS_H_
#define TXL_SERVER_SESSIONS_KEY_COUNTS_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"

namespace txl {

class KeyCounts {
 public:
  int64_t Count(const std::string& key) const {
    const auto it = counts_.find(key);
    return it == counts_.end() ? 0 : it->second;
  }
  void Add(const std::string& key, int64_t delta) {
    auto [it, _] = counts_.try_emplace(key, 0);
    if ((it->second += delta) == 0) counts_.erase(it);
  }
  int64_t keys() const { return static_cast<int64_t>(counts_.size()); }

 private:
  absl::flat_hash_map<std::string, int64_t> counts_;
};

}  // namespace txl

#endif  // TXL_SERVER_SESSIONS_KEY_COUNTS_H_
