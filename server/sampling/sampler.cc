#include "server/sampling/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "model/kernels/sampling_kernels.h"

namespace txl {

absl::Status ValidateSampling(const SamplingConfig& c) {
  if (!(c.temperature >= 0.0f) || !std::isfinite(c.temperature))
    return absl::InvalidArgumentError(absl::StrCat("sampling.temperature must be >= 0, got ", c.temperature));
  if (c.top_k < 0) return absl::InvalidArgumentError(absl::StrCat("sampling.top_k must be >= 0, got ", c.top_k));
  if (!(c.top_p >= 0.0f && c.top_p <= 1.0f))
    return absl::InvalidArgumentError(absl::StrCat("sampling.top_p must be in [0, 1], got ", c.top_p));
  for (const auto& [name, value] : {std::pair<const char*, float>{"presence_penalty", c.presence_penalty},
                                    std::pair<const char*, float>{"frequency_penalty", c.frequency_penalty}}) {
    if (!(value >= -2.0f && value <= 2.0f))
      return absl::InvalidArgumentError(absl::StrCat("sampling.", name, " must be in [-2, 2], got ", value));
  }
  if (c.logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.logit_bias: at most ", kMaxLogitBias, " tokens, got ", c.logit_bias.size()));
  }
  for (const auto& [token, bias] : c.logit_bias) {
    if (token < 0)
      return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias: token ", token, " is negative"));
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias: the bias of token ", token, " must be in [-100, 100], got ", bias));
    }
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingConfig& config, uint64_t seed)
    : config_(config),
      rng_(config.seed != 0 ? config.seed : seed),
      adjusts_(!config.logit_bias.empty() || config.presence_penalty != 0.0f || config.frequency_penalty != 0.0f) {}

void Sampler::Constrain() {
  if (TopCandidates() > 0 || NucleusOnly()) adjusts_ = true;  // the model's lists are not constrained
}

std::vector<float> Masked(absl::Span<const float> row, const AllowedTokens& allowed) {
  std::vector<float> masked(row.size(), -INFINITY);
  for (size_t i = 0; i < row.size(); ++i) {
    if (allowed.contains(static_cast<int64_t>(i))) masked[i] = row[i];
  }
  return masked;
}

std::vector<float> Sampler::Adjusted(absl::Span<const float> logprobs) const {
  for (float x : logprobs) {
    if (std::isnan(x) || x == INFINITY) return {};  // a damaged row: the job fails the request
  }
  std::vector<float> row(logprobs.begin(), logprobs.end());
  const int n = static_cast<int>(row.size());
  for (const auto& [token, bias] : config_.logit_bias) {
    if (token >= n) continue;  // request validation refuses ids outside the vocabulary
    row[token] = bias <= -100.0f ? -INFINITY : row[token] + bias;
  }
  for (const auto& [token, draws] : counts_) {
    if (token < n) row[token] -= config_.frequency_penalty * draws + config_.presence_penalty;
  }
  // A log-softmax again: log-probs of the adjusted distribution.
  float best = -INFINITY;
  for (float x : row) best = std::max(best, x);
  if (!std::isfinite(best)) return {};  // everything banned (a bias alone: request validation refuses that)
  double total = 0;
  for (float x : row) total += std::exp(static_cast<double>(x - best));
  const float log_total = best + static_cast<float>(std::log(total));
  for (float& x : row) x -= log_total;
  return row;
}

void Sampler::Count(int token) {
  if (config_.presence_penalty == 0.0f && config_.frequency_penalty == 0.0f) return;
  for (auto& [t, draws] : counts_) {
    if (t == token) {
      ++draws;
      return;
    }
  }
  counts_.emplace_back(token, 1);
}

bool Sampler::IdOrderDraw() const {
  return config_.temperature > 0.0f && config_.top_k == 0 && !(config_.top_p > 0.0f && config_.top_p < 1.0f);
}

bool Sampler::NucleusOnly() const {
  return config_.temperature > 0.0f && config_.top_k == 0 && config_.top_p > 0.0f && config_.top_p < 1.0f;
}

// One uniform per token keeps seeded streams reproducible.
double Sampler::NextUniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

namespace {

// Likelier (model/step.h), the order a nucleus and a top-k list are cut and
// drawn in, for candidates.
bool Better(float a_lp, int a_id, float b_lp, int b_id) { return Likelier({a_id, a_lp}, {b_id, b_lp}); }

}  // namespace

// The model's nucleus kernel (float weights, with slack over top_p) gives a
// sorted prefix that holds the nucleus; the total, the weights and the cut
// are then the whole-row path's own, in double and in id order, so the token
// is what a full sort would give, to the bit.
int Sampler::SampleNucleus(absl::Span<const float> logprobs, double best, double u) {
  double total = 0;
  for (float lp : logprobs) total += std::exp((lp - best) / config_.temperature);
  const NucleusList prefix =
      NucleusOf(logprobs.data(), static_cast<int64_t>(logprobs.size()), config_.temperature, config_.top_p);
  if (prefix.tokens.empty()) return -1;  // NaN or +inf
  scratch_.resize(prefix.tokens.size());
  for (size_t i = 0; i < prefix.tokens.size(); ++i) {
    const auto& [id, lp] = prefix.tokens[i];
    scratch_[i] = {lp, id, std::exp((lp - best) / config_.temperature)};
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
  if (!top_k && !top_p) {
    return DrawInIdOrder(logprobs.data(), static_cast<int64_t>(logprobs.size()), config_.temperature, u);
  }

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

SamplingPlan Sampler::Plan(int alternatives, std::shared_ptr<const AllowedTokens> allowed) {
  SamplingPlan plan;
  if (adjusts_) return plan;  // the whole row (GenerateJob asks for it) and Sample
  plan.top_n = alternatives;
  if (allowed != nullptr) {  // greedy or a plain temperature (Constrain): the model's constrained pick
    plan.allowed = std::move(allowed);
    plan.temperature = Greedy() ? 1.0f : config_.temperature;
    if (Greedy()) {
      plan.pick = SamplingPlan::Pick::kArgmax;
    } else {
      plan.pick = SamplingPlan::Pick::kDraw;
      plan.uniform = NextUniform();
      plan.fallback_uniform = NextUniform();
    }
    return plan;
  }
  const int candidates = TopCandidates();
  if (candidates > 0) {
    plan.top_n = std::max(candidates, alternatives);
  } else if (Greedy()) {
    if (alternatives == 0) plan.pick = SamplingPlan::Pick::kArgmax;  // else the list's first
  } else if (NucleusOnly()) {
    plan.nucleus_p = config_.top_p;
    plan.temperature = config_.temperature;
  } else {
    plan.pick = SamplingPlan::Pick::kDraw;
    plan.uniform = NextUniform();
    plan.temperature = config_.temperature;
  }
  return plan;
}

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
  size_t last_possible = 0;  // rounding past the end: the last candidate with weight (never a banned one)
  for (size_t i = 0; i < keep; ++i) {
    acc += scratch_[i].weight;
    if (scratch_[i].weight > 0) last_possible = i;
    if (goal < acc) return scratch_[i].id;
  }
  return scratch_[last_possible].id;
}

std::vector<std::pair<int, float>> TopN(absl::Span<const float> logprobs, int n) {
  n = std::min<int>(n, static_cast<int>(logprobs.size()));
  if (n <= 0) return {};
  // A heap whose top is the worst of the n best so far.
  auto better = Likelier;
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
