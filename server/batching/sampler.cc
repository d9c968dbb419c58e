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

bool Sampler::PlainDraw() const {
  return config_.temperature == 1.0f && config_.top_k == 0 && !(config_.top_p > 0.0f && config_.top_p < 1.0f);
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

// Moves the most likely candidates to the front of scratch_, sorted, and
// returns how many: the shortest such prefix whose weight reaches `need` (of
// `total`), found by partitioning around pivots (expected linear time) so
// only the prefix is sorted. The prefix is taken with a little slack over
// `need`: the caller cuts it exactly in sorted order.
size_t Sampler::Nucleus(double total, double need) {
  auto better = [](const Candidate& a, const Candidate& b) { return Better(a.logprob, a.id, b.logprob, b.id); };
  const double goal = std::min(total, need + 1e-9 * total);
  size_t lo = 0, hi = scratch_.size();  // [0, lo): in the prefix; the cut lies in [lo, hi)
  double taken = 0;
  while (hi - lo > 32) {
    // Median of three as the pivot, moved to the end of the range.
    const size_t mid = lo + (hi - lo) / 2;
    Candidate* a = &scratch_[lo];
    Candidate* b = &scratch_[mid];
    Candidate* c = &scratch_[hi - 1];
    if (better(*b, *a)) std::swap(*a, *b);
    if (better(*c, *b)) std::swap(*b, *c);
    if (better(*b, *a)) std::swap(*a, *b);
    std::swap(scratch_[mid], scratch_[hi - 1]);
    const Candidate pivot = scratch_[hi - 1];
    const auto split = std::partition(scratch_.begin() + lo, scratch_.begin() + hi - 1,
                                      [&](const Candidate& x) { return better(x, pivot); });
    std::swap(*split, scratch_[hi - 1]);  // the pivot after everything better than it
    const size_t m = split - scratch_.begin();
    double upper = 0;
    for (size_t i = lo; i <= m; ++i) upper += scratch_[i].weight;
    if (taken + upper >= goal) {
      hi = m + 1;
    } else {
      taken += upper;
      lo = m + 1;
    }
  }
  std::sort(scratch_.begin(), scratch_.begin() + hi, better);
  return hi;
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
  scratch_.resize(V);
  for (size_t i = 0; i < V; ++i) {
    scratch_[i] = {logprobs[i], static_cast<int>(i), std::exp((logprobs[i] - best) / config_.temperature)};
  }
  auto better = [](const Candidate& a, const Candidate& b) { return Better(a.logprob, a.id, b.logprob, b.id); };
  size_t keep = V;
  double total = 0;
  if (top_k) {
    keep = static_cast<size_t>(config_.top_k);
    std::nth_element(scratch_.begin(), scratch_.begin() + keep, scratch_.end(), better);
    std::sort(scratch_.begin(), scratch_.begin() + keep, better);
    for (size_t i = 0; i < keep; ++i) total += scratch_[i].weight;
  } else {
    for (const Candidate& c : scratch_) total += c.weight;
    keep = Nucleus(total, config_.top_p * total);
  }
  return CutAndDraw(keep, total, u, top_k);
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
  return CutAndDraw(keep, total, u, /*top_k=*/true);
}

int Sampler::CutAndDraw(size_t keep, double total, double u, bool top_k) {
  const size_t V = scratch_.size();
  const bool top_p = config_.top_p > 0.0f && config_.top_p < 1.0f;
  if (top_p) {
    // Smallest prefix whose tempered mass reaches top_p.
    double mass = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      mass += scratch_[i].weight / total;
      if (mass >= config_.top_p) {
        cut = i + 1;
        break;
      }
    }
    if (cut == keep && !top_k && keep < V && mass < config_.top_p) {
      // Rounding left the selected prefix just short: sort the rest too.
      auto better = [](const Candidate& a, const Candidate& b) { return Better(a.logprob, a.id, b.logprob, b.id); };
      std::sort(scratch_.begin() + keep, scratch_.end(), better);
      for (cut = keep; cut < V && mass < config_.top_p; ++cut) mass += scratch_[cut].weight / total;
    }
    keep = cut;
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
