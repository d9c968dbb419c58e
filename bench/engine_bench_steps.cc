// engine_bench: Bench's timed engine steps: loading the model, sessions with
// full windows, single-token steps with each readout a request can ask for
// (distribution, argmax, draws, lists, nucleus, Score), and scored segments.
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/engine_bench.h"
#include "model/net/checkpoint.h"
#include "model/net/language_model.h"

namespace engine_bench {

using txl::SamplingPlan;

Bench::Bench(const std::string& path, const std::string& device, txl::Kernels kernels, txl::DecodeGraphs decode_graphs,
             int threads, Sizes sizes, txl::WeightDtype dtype, txl::KvDtype kv_dtype, bool sdpa_pass_attention)
    : sizes_(std::move(sizes)),
      path_(path),
      device_(device),
      kernels_(kernels),
      decode_graphs_(decode_graphs),
      dtype_(dtype),
      kv_dtype_(kv_dtype),
      sdpa_pass_attention_(sdpa_pass_attention),
      cuda_(device != "cpu") {
  txl::LanguageModelOptions o;
  o.path = path;
  o.device = device;
  o.kernels = kernels;
  o.decode_graphs = decode_graphs;
  o.dtype = dtype;
  o.kv_dtype = kv_dtype;
  o.sdpa_pass_attention = sdpa_pass_attention;
  o.threads = threads;
  const auto start = Clock::now();
  lm_ = Must(LanguageModel::Create(o), "loading " + path);
  load_seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
  rss_after_load_ = RssBytes();
  txl::Checkpoint ckpt = Must(txl::LoadCheckpoint(path), "loading " + path);
  config_ = ckpt.config;
  weights_ = ckpt.weights->To(at::Device(device));
}

void Bench::Sync() const {
  if (cuda_) torch::cuda::synchronize();
}

std::vector<int> Bench::RandomTokens(int64_t n, uint64_t seed) const {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(0, static_cast<int>(config_.n_token) - 1);
  std::vector<int> t(n);
  for (int& x : t) x = d(rng);
  return t;
}

std::unique_ptr<SessionState> Bench::FullSession(int64_t mem_len, uint64_t seed, LanguageModel* lm) {
  if (lm == nullptr) lm = lm_.get();
  auto s = Must(lm->NewSession(mem_len), "new session");
  std::vector<StepInput> in(1);
  in[0].session = s.get();
  in[0].tokens = RandomTokens(mem_len - 1, seed);
  Must(lm->Step(absl::MakeSpan(in)), "filling a session");
  if (s->memory_tokens() != mem_len - 1) Fail("a filled session does not hold a full window");
  return s;
}

// Seconds per step over `n` single-token steps of all `sessions` at once,
// each asking for its next-token distribution.
double Bench::EngineSteps(const std::vector<SessionState*>& sessions, int n, LanguageModel* lm) {
  return ReadoutSteps(sessions, n, Readout::kDistribution, lm);
}

const char* Bench::ReadoutName(Readout r) {
  switch (r) {
    case Readout::kNone: return "layers only";
    case Readout::kDistribution: return "whole distribution";
    case Readout::kTopP: return "top-p 0.9 at temperature 0.8 (the model's nucleus list + the host's cut and draw)";
    case Readout::kDrawTempered: return "temperature 0.8 (the model's draw over the whole row)";
    case Readout::kArgmax: return "greedy (model argmax)";
    case Readout::kDraw: return "temperature 1 (model draw)";
    case Readout::kScore: return "Score (one target's log-prob, Zipf-ranked targets)";
    case Readout::kTopK: return "top-k 40 at temperature 0.8 (the model's list + the host's draw)";
    case Readout::kTopN: return "greedy with 5 alternatives (the model's list of 5)";
    case Readout::kDrawAllowingMost:
      return "temperature 1 under a constraint allowing 99% of the words (the model's constrained draw)";
    case Readout::kDrawAllowingFew:
      return "temperature 1 under a constraint allowing 8 words of the shortlist (the model's constrained draw, drawn "
             "again from the head)";
    case Readout::kDrawAllowingFewSpread:
      return "temperature 1 under a constraint allowing 8 words spread over the clusters (the model's constrained "
             "draw, drawn again from the whole row)";
  }
  return "";
}

// A target as text has them: ids ranked by frequency (as word-level
// vocabularies are), drawn with probability 1 / (rank + 1). With
// WT103's cutoffs, 80% fall in the 20,000-word shortlist.
int Bench::ZipfToken() {
  if (zipf_cdf_.empty()) {
    double acc = 0;
    for (int64_t k = 0; k < config_.n_token; ++k) zipf_cdf_.push_back(acc += 1.0 / (k + 1));
  }
  const double u = std::uniform_real_distribution<double>(0.0, zipf_cdf_.back())(draw_rng_);
  const size_t k = std::upper_bound(zipf_cdf_.begin(), zipf_cdf_.end(), u) - zipf_cdf_.begin();
  return static_cast<int>(std::min<size_t>(k, zipf_cdf_.size() - 1));
}

// Mean entropy (nats) of the sessions' next-token distributions.
double Bench::MeanEntropy(const std::vector<SessionState*>& sessions) {
  std::vector<StepInput> in(sessions.size());
  for (size_t s = 0; s < sessions.size(); ++s) {
    in[s].session = sessions[s];
    in[s].tokens = {static_cast<int>((counter_++ * 7919) % config_.n_token)};
    in[s].want_last_distribution = true;
  }
  double total = 0;
  for (const StepOutput& o : Must(lm_->Step(absl::MakeSpan(in)), "engine step")) {
    for (float lp : o.last_distribution) total -= std::exp(lp) * lp;
  }
  return total / sessions.size();
}

// Seconds per step over `n` steps of all `sessions` at once: fill(s, in)
// sets session s's input beyond its session, read(out) consumes each output.
double Bench::TimedSteps(const std::vector<SessionState*>& sessions, int n, LanguageModel* lm,
                         const std::function<void(size_t, StepInput&)>& fill,
                         const std::function<void(StepOutput&)>& read) {
  std::vector<StepInput> in(sessions.size());
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    for (size_t s = 0; s < sessions.size(); ++s) {
      in[s] = StepInput();
      in[s].session = sessions[s];
      fill(s, in[s]);
    }
    for (StepOutput& o : Must(lm->Step(absl::MakeSpan(in)), "engine step")) read(o);
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / n;
}

double Bench::ReadoutSteps(const std::vector<SessionState*>& sessions, int n, Readout readout, LanguageModel* lm) {
  if (allowing_most_ == nullptr) {
    const int64_t V = config_.n_token;
    const int64_t shortlist = config_.cutoffs.empty() ? V : config_.cutoffs.front();
    auto most = std::make_shared<txl::AllowedTokens>(), few = std::make_shared<txl::AllowedTokens>(),
         spread = std::make_shared<txl::AllowedTokens>();
    for (auto* a : {most.get(), few.get(), spread.get()}) a->words.assign(static_cast<size_t>((V + 63) / 64), 0);
    auto allow = [](txl::AllowedTokens* a, int64_t id) {
      a->words[static_cast<size_t>(id / 64)] |= uint64_t{1} << (id % 64);
    };
    for (int64_t t = 0; t < V; ++t) {
      if (t % 100 != 7) allow(most.get(), t);
    }
    for (int64_t t = 0; t < 8; ++t) {
      allow(few.get(), (t * 2477 + 11) % shortlist);
      allow(spread.get(), (t * 33461 + 11) % V);
    }
    allowing_most_ = std::move(most);
    allowing_few_ = std::move(few);
    allowing_spread_ = std::move(spread);
  }
  auto fill = [&](size_t, StepInput& x) {
    x.tokens = {static_cast<int>((counter_++ * 7919) % config_.n_token)};
    switch (readout) {
      case Readout::kNone: break;
      case Readout::kDistribution: x.want_last_distribution = true; break;
      case Readout::kTopP:
        x.plan.nucleus_p = 0.9f;
        x.plan.temperature = 0.8f;
        break;
      case Readout::kDrawTempered:
        x.plan.pick = SamplingPlan::Pick::kDraw;
        x.plan.temperature = 0.8f;
        x.plan.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(draw_rng_);
        break;
      case Readout::kArgmax: x.plan.pick = SamplingPlan::Pick::kArgmax; break;
      case Readout::kDraw:
        x.plan.pick = SamplingPlan::Pick::kDraw;
        x.plan.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(draw_rng_);
        break;
      case Readout::kScore: x.targets = {ZipfToken()}; break;
      case Readout::kTopK: x.plan.top_n = top_k_.TopCandidates(); break;
      case Readout::kTopN: x.plan.top_n = 5; break;
      case Readout::kDrawAllowingMost:
      case Readout::kDrawAllowingFew:
      case Readout::kDrawAllowingFewSpread:
        x.plan.pick = SamplingPlan::Pick::kDraw;
        x.plan.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(draw_rng_);
        x.plan.fallback_uniform = std::uniform_real_distribution<double>(0.0, 1.0)(draw_rng_);
        x.plan.allowed = readout == Readout::kDrawAllowingMost  ? allowing_most_
                         : readout == Readout::kDrawAllowingFew ? allowing_few_
                                                                : allowing_spread_;
        break;
    }
  };
  auto read = [&](StepOutput& o) {
    if (readout == Readout::kTopP) sink_ += top_p_.SampleFromNucleus(o.nucleus, o.nucleus_total);
    if (readout == Readout::kTopK) sink_ += top_k_.SampleFromTop(o.top);
    if (readout == Readout::kTopN) sink_ += o.top[4].first;
    if (readout == Readout::kDistribution) sink_ += o.last_distribution[0];
    sink_ += o.picked + (o.target_logprobs.empty() ? 0 : o.target_logprobs[0]);
  };
  return TimedSteps(sessions, n, lm == nullptr ? lm_.get() : lm, fill, read);
}

// Seconds per step over `n` steps that each feed every session a segment of
// `seg` tokens and score each position's next token (as Score does).
double Bench::ScoreSteps(const std::vector<SessionState*>& sessions, int n, int64_t seg) {
  std::vector<std::vector<int>> tokens, targets;
  for (size_t s = 0; s < sessions.size(); ++s) {
    tokens.push_back(RandomTokens(seg, 100 + s));
    targets.push_back(RandomTokens(seg, 200 + s));
  }
  return TimedSteps(
      sessions, n, lm_.get(),
      [&](size_t s, StepInput& x) {
        x.tokens = tokens[s];
        x.targets = targets[s];
      },
      [&](StepOutput& o) { sink_ += o.target_logprobs.back(); });
}

std::unique_ptr<LanguageModel> Bench::Load(txl::WeightDtype dtype, txl::KvDtype kv) const {
  txl::LanguageModelOptions o;
  o.path = path_;
  o.device = device_;
  o.kernels = kernels_;
  o.decode_graphs = decode_graphs_;
  o.dtype = dtype;
  o.kv_dtype = kv;
  return Must(LanguageModel::Create(o), "loading " + path_ + " as " + txl::DtypeName(dtype));
}

}  // namespace engine_bench
