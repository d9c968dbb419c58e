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

bool Sampler::IdOrderDraw() const {
  return config_.temperature > 0.0f && config_.top_k == 0 && !(config_.top_p > 0.0f && config_.top_p < 1.0f);
}

bool Sampler::NucleusOnly() const {
  return config_.temperature > 0.0f && config_.top_k == 0 && config_.top_p > 0.0f && config_.top_p < 1.0f;
}

// One uniform per token keeps seeded streams reproducible.
double Sampler::NextUniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

namespace {

// Descending probability, ties to the lower id: the order a nucleus and a
// top-k list are cut and drawn in.
bool Better(float a_lp, int a_id, float b_lp, int b_id) { return a_lp > b_lp || (a_lp == b_lp && a_id < b_id); }

}  // namespace

int DrawInIdOrder(absl::Span<const float> logprobs, double u, float temperature) {
  const size_t V = logprobs.size();
  const double shift = temperature == 1.0f ? 0.0 : *std::max_element(logprobs.begin(), logprobs.end());
  std::vector<double> cumulative(V);
  double acc = 0;
  for (size_t i = 0; i < V; ++i) {
    acc += temperature == 1.0f ? std::exp(static_cast<double>(logprobs[i]))
                               : std::exp((logprobs[i] - shift) / temperature);
    cumulative[i] = acc;
  }
  const double goal = u * acc;
  // The first entry whose cumulative weight exceeds the goal.
  const size_t i = std::upper_bound(cumulative.begin(), cumulative.end(), goal) - cumulative.begin();
  return static_cast<int>(std::min(i, V - 1));
}

// The nucleus is a prefix of the row in the sampler's order, and that order
// follows each token's distance below the best. One pass sums the tempered
// weights in id order (the total) and by distance, in buckets of 1/64 nat;
// the buckets give a prefix that holds the nucleus, and only its tokens are
// collected and sorted. The weights, the total and the cut are what a full
// sort would use, to the bit, so the token is too.
int Sampler::SampleNucleus(absl::Span<const float> logprobs, double best, double u) {
  constexpr int kBuckets = 4096;
  constexpr double kPerNat = 64;
  const double t = config_.temperature;
  const size_t V = logprobs.size();
  buckets_.assign(kBuckets, 0.0);
  bucket_of_.resize(V);
  double total = 0;
  for (size_t i = 0; i < V; ++i) {
    const double x = (logprobs[i] - best) / t;
    const double w = std::exp(x);
    total += w;
    // Monotone in the log-prob; the last bucket also takes -inf (and NaN).
    const double d = -x * kPerNat;
    const int b = d < kBuckets - 1 ? static_cast<int>(d) : kBuckets - 1;
    bucket_of_[i] = static_cast<uint16_t>(b);
    buckets_[b] += w;
  }
  // A little slack over top_p, as the buckets sum in another order than the cut.
  const double goal = std::min(total, (config_.top_p + 1e-9) * total);
  int last = 0;
  for (double mass = buckets_[0]; mass < goal && last < kBuckets - 1;) mass += buckets_[++last];
  for (;;) {
    scratch_.clear();
    for (size_t i = 0; i < V; ++i) {
      if (bucket_of_[i] <= last)
        scratch_.push_back({logprobs[i], static_cast<int>(i), std::exp((logprobs[i] - best) / t)});
    }
    std::sort(scratch_.begin(), scratch_.end(),
              [](const Candidate& a, const Candidate& b) { return Better(a.logprob, a.id, b.logprob, b.id); });
    if (last == kBuckets - 1) break;
    double mass = 0;
    for (const Candidate& c : scratch_) mass += c.weight / total;
    if (mass >= config_.top_p) break;
    ++last;  // rounding beyond the slack: one bucket more
  }
  return CutAndDraw(scratch_.size(), total, u);
}

int Sampler::Sample(absl::Span<const float> logprobs) {
  const size_t V = logprobs.size();
  if (config_.temperature == 0.0f) {
    return static_cast<int>(std::max_element(logprobs.begin(), logprobs.end()) - logprobs.begin());
  }
  const double u = NextUniform();
  const bool top_k = config_.top_k > 0 && static_cast<size_t>(config_.top_k) < V;
  const bool top_p = config_.top_p > 0.0f && config_.top_p < 1.0f;
  if (!top_k && !top_p) return DrawInIdOrder(logprobs, u, config_.temperature);

  // Tempered weights relative to the best, so exp never overflows.
  const double best = *std::max_element(logprobs.begin(), logprobs.end());
  if (!top_k) return SampleNucleus(logprobs, best, u);
  scratch_.resize(V);
  for (size_t i = 0; i < V; ++i) {
    scratch_[i] = {logprobs[i], static_cast<int>(i), std::exp((logprobs[i] - best) / config_.temperature)};
  }
  const size_t keep = static_cast<size_t>(config_.top_k);
  auto better = [](const Candidate& a, const Candidate& b) { return Better(a.logprob, a.id, b.logprob, b.id); };
  std::nth_element(scratch_.begin(), scratch_.begin() + keep, scratch_.end(), better);
  std::sort(scratch_.begin(), scratch_.begin() + keep, better);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += scratch_[i].weight;
  return CutAndDraw(keep, total, u);
}

int Sampler::TopCandidates() const { return config_.temperature > 0.0f && config_.top_k > 0 ? config_.top_k : 0; }

int Sampler::SampleFromTop(absl::Span<const std::pair<int, float>> top) {
  const double u = NextUniform();
  // The same weights Sample gives these candidates: the first is the row's
  // best, so the shift is the same.
  const size_t keep = std::min(top.size(), static_cast<size_t>(config_.top_k));
  scratch_.resize(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    scratch_[i] = {top[i].second, top[i].first,
                   std::exp((top[i].second - static_cast<double>(top[0].second)) / config_.temperature)};
    total += scratch_[i].weight;
  }
  return CutAndDraw(keep, total, u);
}

int Sampler::SampleFromNucleus(absl::Span<const std::pair<int, float>> nucleus, double total) {
  const double u = NextUniform();
  scratch_.resize(nucleus.size());
  for (size_t i = 0; i < nucleus.size(); ++i) {
    scratch_[i] = {nucleus[i].second, nucleus[i].first,
                   std::exp((nucleus[i].second - static_cast<double>(nucleus[0].second)) / config_.temperature)};
  }
  return CutAndDraw(nucleus.size(), total, u);
}

int Sampler::CutAndDraw(size_t keep, double total, double u) {
  if (config_.top_p > 0.0f && config_.top_p < 1.0f) {
    // Smallest prefix whose tempered mass reaches top_p (all of it, if
    // rounding keeps the sum just short).
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += scratch_[i].weight / total;
      if (mass >= config_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += scratch_[i].weight;
  const double goal = u * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += scratch_[i].weight;
    if (goal < acc) return scratch_[i].id;
  }
  return scratch_[keep - 1].id;
}

std::vector<std::pair<int, float>> TopN(absl::Span<const float> logprobs, int n) {
  n = std::min<int>(n, static_cast<int>(logprobs.size()));
  if (n <= 0) return {};
  // A heap whose top is the worst of the n best so far.
  auto better = [](const std::pair<int, float>& a, const std::pair<int, float>& b) {
    return Better(a.second, a.first, b.second, b.first);
  };
  std::vector<std::pair<int, float>> heap;
  heap.reserve(n);
  for (size_t i = 0; i < logprobs.size(); ++i) {
    const std::pair<int, float> c = {static_cast<int>(i), logprobs[i]};
    if (heap.size() < static_cast<size_t>(n)) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(c, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  return heap;
}

}  // namespace txl
