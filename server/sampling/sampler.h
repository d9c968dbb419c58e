// Sampler: picks the next token from a log-prob vector, per request
// parameters. Torch-free; the engine thread calls it for every row of a
// batch. A seeded sampler is reproducible: the same seed and distributions
// give the same tokens, whatever else runs in the batch. Nothing sorts the
// whole vocabulary (docs/DESIGN.md, "Sampling paths"): plain temperature
// walks the distribution in id order; top-k selects its k candidates
// (nth_element) and sorts only them, or takes them from the model's list;
// top-p takes a sorted prefix that holds its nucleus from the model's
// nucleus kernel (model/kernels/sampling_kernels.h) and cuts it in double.
#ifndef TXL_SERVER_SAMPLING_SAMPLER_H_
#define TXL_SERVER_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "model/kernels/sampling_kernels.h"
#include "model/step.h"

namespace txl {

struct SamplingConfig {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: no limit
  float top_p = 0.0f;        // 0 or 1: no limit
  uint64_t seed = 0;         // 0: the caller supplies a random seed
  // Added to a token's logit before everything else, in [-100, 100]; -100
  // bans the token outright (OpenAI's logit_bias). Token ids, no repeats.
  std::vector<std::pair<int, float>> logit_bias;
  // OpenAI's, in [-2, 2], over the tokens this sampler drew (Count): a
  // drawn token's logit loses frequency_penalty per draw and
  // presence_penalty once.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
};

// The largest logit_bias a request may give.
inline constexpr int kMaxLogitBias = 1024;

// INVALID_ARGUMENT naming the field and its range.
absl::Status ValidateSampling(const SamplingConfig& config);

// Not thread-safe: one request owns one Sampler.
class Sampler {
 public:
  // `seed` is used when config.seed is 0.
  Sampler(const SamplingConfig& config, uint64_t seed);

  // A token drawn from a whole row, as the model's picks, lists and nuclei
  // would give it; -1 if the row holds NaN or +inf.
  int Sample(absl::Span<const float> logprobs);

  // True when a draw needs no more than the id-order draw at the temperature
  // (DrawInIdOrder, model/kernels/sampling_kernels.h: a
  // temperature > 0, no top-k or top-p): the model can then draw itself
  // (SamplingPlan::Pick::kDraw) from NextUniform(), the same uniform Sample
  // would have used.
  bool IdOrderDraw() const;
  bool Greedy() const { return config_.temperature == 0.0f; }
  double NextUniform();

  // k when the draw needs only the k most likely tokens (a temperature > 0
  // with top-k, with or without top-p), else 0. The model can then list
  // them (SamplingPlan::top_n) instead of sending the whole row.
  int TopCandidates() const;

  // The token Sample would draw from the whole row, from that row's top
  // candidates only: `top` holds its TopCandidates() most likely tokens,
  // sorted as TopN sorts them. Uses one uniform, as Sample does.
  int SampleFromTop(absl::Span<const std::pair<int, float>> top);

  // True for top-p without top-k: the model can then list a prefix of the
  // row that holds the nucleus, with the row's total weight
  // (SamplingPlan::nucleus_p), and SampleFromNucleus cuts and draws there.
  bool NucleusOnly() const;
  // The token Sample would draw from the whole row, up to the rounding of
  // `total` (the model sums float weights): `nucleus` sorted as TopN sorts,
  // holding the nucleus. Uses one uniform, as Sample does.
  int SampleFromNucleus(absl::Span<const std::pair<int, float>> nucleus, double total);

  // True when the draw needs the whole row (StepInput::want_last_distribution)
  // and Plan asks the model for nothing: with a logit bias or a penalty,
  // and with a constraint (Constrain) under top-k or top-p. The job then
  // draws with Sample(Adjusted(row)), masked (Masked) under a constraint.
  bool Adjusts() const { return adjusts_; }
  // A constraint (a grammar) will allow only some tokens at each step.
  // Greedy and plain temperatures keep the model's own pick, constrained
  // (Plan's `allowed`); top-k and top-p take the whole row.
  void Constrain();
  // The row with the bias and penalties applied, as log-probs again (a
  // log-softmax; a banned token's is -inf). Empty when the row holds a NaN
  // or +inf, or nothing is left to draw.
  std::vector<float> Adjusted(absl::Span<const float> logprobs) const;
  // A token drawn, for the penalties.
  void Count(int token);

  // What the model gives for the next token (docs/DESIGN.md, "Sampling
  // paths"), so that no whole row leaves it: for top-k the list of
  // max(TopCandidates(), alternatives); for greedy the argmax, or with
  // alternatives the list (its first is the token); for top-p alone the
  // nucleus; else the model's draw at NextUniform(), taken here
  // (SampleFromTop and SampleFromNucleus take theirs when they draw).
  // `alternatives` > 0 (a request's logprobs): that many are listed too.
  // With `allowed` (a constraint's tokens, after Constrain) the pick is the
  // model's constrained pick (SamplingPlan::allowed), drawn at two
  // uniforms; the list stays the model's own.
  SamplingPlan Plan(int alternatives, std::shared_ptr<const AllowedTokens> allowed = nullptr);

 private:
  struct Candidate {
    float logprob;
    int id;
    double weight;  // tempered, relative to the best
  };
  // Top-p without top-k, at u.
  int SampleNucleus(absl::Span<const float> logprobs, double best, double u);
  // scratch_[0, keep) sorted, `total` the weight the top-p cut is taken
  // against: the cut (if any), then the draw at u in that order.
  int CutAndDraw(size_t keep, double total, double u);

  SamplingConfig config_;
  std::mt19937_64 rng_;
  std::vector<Candidate> scratch_;
  bool adjusts_ = false;
  std::vector<std::pair<int, int>> counts_;  // token, draws; in first-drawn order
};

// `row` with every token `allowed` does not hold at -inf: a constraint's
// row for Sample (its log-probs are not renormalised; Sample needs no
// more).
std::vector<float> Masked(absl::Span<const float> row, const AllowedTokens& allowed);

// The n most likely tokens, most likely first (ties: lower id first); a heap
// of n, not a sort of the vocabulary.
std::vector<std::pair<int, float>> TopN(absl::Span<const float> logprobs, int n);

}  // namespace txl

#endif  // TXL_SERVER_SAMPLING_SAMPLER_H_
