// TokenHistory: the last tokens of a session's history, by absolute
// position, so that a rewind or a fork at a position can rebuild the state
// there by replay (docs/SESSIONS.md, "Rewind"). At most `keep` tokens are
// held (SessionTableConfig::history_tokens); older ones drop off the front,
// and start() says where what is held begins.
//
// Invariant kept by its users: end() equals the session's position.
// Not thread-safe: it moves with the session (table entry or lease).
#ifndef TXL_SERVER_SESSIONS_TOKEN_HISTORY_H_
#define TXL_SERVER_SESSIONS_TOKEN_HISTORY_H_

#include <cstdint>
#include <deque>
#include <vector>

namespace txl {

class TokenHistory {
 public:
  TokenHistory() = default;
  explicit TokenHistory(int64_t start) : start_(start) {}
  TokenHistory(int64_t start, const std::vector<int>& tokens) : start_(start), tokens_(tokens.begin(), tokens.end()) {}

  int64_t start() const { return start_; }
  int64_t end() const { return start_ + static_cast<int64_t>(tokens_.size()); }

  // Appends at end(); then drops the oldest tokens past `keep` (0: keep all).
  void Append(const std::vector<int>& tokens, int64_t keep);
  // Forgets everything at or after `position` (below start(): all of it, and
  // the history goes on from `position`).
  void Truncate(int64_t position);
  // Whether [from, to) is held.
  bool Covers(int64_t from, int64_t to) const { return from >= start_ && from <= to && to <= end(); }
  // Tokens [from, to); empty unless Covers(from, to).
  std::vector<int> Slice(int64_t from, int64_t to) const;
  // The history up to `position`, as a new one (a fork at that position).
  TokenHistory Prefix(int64_t position) const;

 private:
  int64_t start_ = 0;
  std::deque<int> tokens_;
};

}  // namespace txl

#endif  // TXL_SERVER_SESSIONS_TOKEN_HISTORY_H_
