// Sampler: picks the next token from a log-prob vector, per request
// parameters. Torch-free; the engine thread calls it for every row of a
// batch. A seeded sampler is reproducible: the same seed and distributions
// give the same tokens, whatever else runs in the batch.
#ifndef TXL_SERVER_BATCHING_SAMPLER_H_
#define TXL_SERVER_BATCHING_SAMPLER_H_

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace txl {

struct SamplingConfig {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: no limit
  float top_p = 0.0f;        // 0 or 1: no limit
  uint64_t seed = 0;         // 0: the caller supplies a random seed
};

// INVALID_ARGUMENT naming the field and its range.
absl::Status ValidateSampling(const SamplingConfig& config);

// Not thread-safe: one request owns one Sampler.
class Sampler {
 public:
  // `seed` is used when config.seed is 0.
  Sampler(const SamplingConfig& config, uint64_t seed);

  int Sample(absl::Span<const float> logprobs);

 private:
  SamplingConfig config_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int>> scratch_;
};

// The n most likely tokens, most likely first (ties: lower id first).
std::vector<std::pair<int, float>> TopN(absl::Span<const float> logprobs, int n);

}  // namespace txl

#endif  // TXL_SERVER_BATCHING_SAMPLER_H_
