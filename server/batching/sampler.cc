#include "server/batching/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace txl {

absl::Status ValidateSampling(const SamplingConfig& c) {
  if (!(c.temperature >= 0.0f) || !std::isfinite(c.temperature))
    return absl::InvalidArgumentError(absl::StrCat("sampling.temperature must be >= 0, got ", c.temperature));
  if (c.top_k < 0) return absl::InvalidArgumentError(absl::StrCat("sampling.top_k must be >= 0, got ", c.top_k));
  if (!(c.top_p >= 0.0f && c.top_p <= 1.0f))
    return absl::InvalidArgumentError(absl::StrCat("sampling.top_p must be in [0, 1], got ", c.top_p));
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingConfig& config, uint64_t seed)
    : config_(config), rng_(config.seed != 0 ? config.seed : seed) {}

int Sampler::Sample(absl::Span<const float> logprobs) {
  const int V = static_cast<int>(logprobs.size());
  if (config_.temperature == 0.0f) {
    return static_cast<int>(std::max_element(logprobs.begin(), logprobs.end()) - logprobs.begin());
  }
  // Candidates by descending probability (ties: lower id), cut by top_k.
  scratch_.resize(V);
  for (int i = 0; i < V; ++i) scratch_[i] = {logprobs[i], i};
  auto better = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int keep = V;
  if (config_.top_k > 0 && config_.top_k < V) {
    keep = config_.top_k;
    std::partial_sort(scratch_.begin(), scratch_.begin() + keep, scratch_.end(), better);
  } else {
    std::sort(scratch_.begin(), scratch_.end(), better);
  }
  // Tempered weights relative to the best, so exp never overflows.
  const double best = scratch_[0].first;
  std::vector<double> weights(keep);
  double total = 0;
  for (int i = 0; i < keep; ++i) {
    weights[i] = std::exp((scratch_[i].first - best) / config_.temperature);
    total += weights[i];
  }
  if (config_.top_p > 0.0f && config_.top_p < 1.0f) {
    // Smallest prefix whose tempered mass reaches top_p.
    double mass = 0;
    int cut = keep;
    for (int i = 0; i < keep; ++i) {
      mass += weights[i] / total;
      if (mass >= config_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = 0;
    for (int i = 0; i < keep; ++i) total += weights[i];
  }
  // One uniform draw per token keeps seeded streams reproducible.
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double acc = 0;
  for (int i = 0; i < keep; ++i) {
    acc += weights[i];
    if (u < acc) return scratch_[i].second;
  }
  return scratch_[keep - 1].second;
}

std::vector<std::pair<int, float>> TopN(absl::Span<const float> logprobs, int n) {
  std::vector<std::pair<int, float>> all(logprobs.size());
  for (size_t i = 0; i < logprobs.size(); ++i) all[i] = {static_cast<int>(i), logprobs[i]};
  n = std::min<int>(n, static_cast<int>(all.size()));
  std::partial_sort(all.begin(), all.begin() + n, all.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
  all.resize(n);
  return all;
}

}  // namespace txl
