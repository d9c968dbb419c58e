// The shapes decode steps are padded to, so that a CUDA graph captured once
// per shape serves every step that fits (docs/MODEL.md, "Decode graphs"):
// sessions up to the next power of two, keys (held positions plus the new
// one) up to the next multiple of kKeyBucket.
#ifndef TXL_MODEL_NET_DECODE_BUCKETS_H_
#define TXL_MODEL_NET_DECODE_BUCKETS_H_

#include <cstdint>

namespace txl {

struct DecodeBucket {
  static constexpr int64_t kKeyBucket = 128;
  int64_t sessions = 0;  // >= the step's sessions
  int64_t keys = 0;      // >= the most keys one session attends

  static DecodeBucket For(int64_t sessions, int64_t keys) {
    DecodeBucket b;
    b.sessions = 1;
    while (b.sessions < sessions) b.sessions *= 2;
    b.keys = (keys + kKeyBucket - 1) / kKeyBucket * kKeyBucket;
    if (b.keys == 0) b.keys = kKeyBucket;
    return b;
  }
  bool operator<(const DecodeBucket& o) const { return sessions != o.sessions ? sessions < o.sessions : keys < o.keys; }
};

}  // namespace txl

#endif  // TXL_MODEL_NET_DECODE_BUCKETS_H_
