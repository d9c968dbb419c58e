// The shapes decode steps and small multi-token passes are padded to, so
// that a CUDA graph captured once per shape serves every pass that fits
// (docs/MODEL.md, "Decode graphs"): sessions up to the next power of two,
// tokens per session 1 (a decode step) or the next power of two, keys (held
// positions plus the new ones) up to the next multiple of kKeyBucket.
#ifndef TXL_MODEL_NET_DECODE_BUCKETS_H_
#define TXL_MODEL_NET_DECODE_BUCKETS_H_

#include <cstdint>

namespace txl {

struct DecodeBucket {
  static constexpr int64_t kKeyBucket = 128;
  int64_t sessions = 0;  // >= the step's sessions
  int64_t tokens = 1;    // >= the most tokens one session feeds
  int64_t keys = 0;      // >= the most keys one session attends

  // A decode step: one token a session.
  static DecodeBucket For(int64_t sessions, int64_t keys) { return ForPass(sessions, 1, keys - 1); }
  // A pass whose sessions feed at most `tokens` after at most `held` positions.
  static DecodeBucket ForPass(int64_t sessions, int64_t tokens, int64_t held) {
    DecodeBucket b;
    b.sessions = PowerOfTwo(sessions);
    b.tokens = PowerOfTwo(tokens);
    b.keys = (held + b.tokens + kKeyBucket - 1) / kKeyBucket * kKeyBucket;
    if (b.keys == 0) b.keys = kKeyBucket;
    return b;
  }
  bool operator<(const DecodeBucket& o) const {
    if (sessions != o.sessions) return sessions < o.sessions;
    return tokens != o.tokens ? tokens < o.tokens : keys < o.keys;
  }

 private:
  static int64_t PowerOfTwo(int64_t n) {
    int64_t p = 1;
    while (p < n) p *= 2;
    return p;
  }
};

}  // namespace txl

#endif  // TXL_MODEL_NET_DECODE_BUCKETS_H_
