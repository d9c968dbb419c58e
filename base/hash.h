// Hash64: a fast, non-cryptographic 64-bit hash (FNV-1a over 8-byte words)
// for fingerprints of weights and checksums of exported sessions: it
// detects accidental change (a different model, a damaged file), not forgery.
#ifndef TXL_BASE_HASH_H_
#define TXL_BASE_HASH_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace txl {

inline constexpr uint64_t kHash64Seed = 0xcbf29ce484222325ULL;

// Continue a hash with `n` more bytes (pass the previous result as `h`).
inline uint64_t Hash64(const void* data, size_t n, uint64_t h = kHash64Seed) {
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * kPrime;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * kPrime;
  return (h ^ n) * kPrime;  // the length too, so trailing zero bytes count
}

}  // namespace txl

#endif  // TXL_BASE_HASH_H_
