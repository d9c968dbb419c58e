// Tempered sampling over whole log-prob rows inside the model, so such rows
// never leave it: the nucleus of top-p, and a draw at a temperature other
// than 1. Torch-free, on host memory (LanguageModel::Step splits the rows
// over threads). Weights are exp((lp - best) / t) by simd.h's 8-lane exp in
// float, summed in double: they agree with the sampler's double arithmetic
// (server/sampling/sampler.cc) to float rounding (docs/DESIGN.md, "Sampling
// paths").
#ifndef TXL_MODEL_KERNELS_SAMPLING_KERNELS_H_
#define TXL_MODEL_KERNELS_SAMPLING_KERNELS_H_

#include <cstdint>

#include "model/step.h"

namespace txl {

struct NucleusList {
  // A prefix of the row in the sampler's order (log-prob descending, ties
  // to the lower id) that holds the nucleus: the smallest prefix whose
  // weight reaches top_p of the total. Slightly longer, not shorter.
  TokenList tokens;
  double total = 0;  // the weight of the whole row, relative to its best
};
// Empty tokens if the row holds NaN or +inf.
NucleusList NucleusOf(const float* row, int64_t n, float temperature, float top_p);

// The one id-order draw, the model's (a whole-row draw, SamplingPlan's
// kDraw) and the host's (Sampler) alike: the first token in id order whose
// cumulative weight exp((logprob - best) / temperature) exceeds u * total
// (u in [0, 1)); a token of log-prob -inf is never drawn. -1 if the row
// holds NaN or +inf.
int DrawInIdOrder(const float* row, int64_t n, float temperature, double u);

// A constrained pick (SamplingPlan::allowed) from the whole row, given the
// unconstrained pick `first` (the argmax, or the draw at plan.uniform):
// `first` if plan.allowed holds it, else the argmax (plan.pick kArgmax)
// or DrawInIdOrder at plan.fallback_uniform over the row with every
// token the constraint refuses at -inf (walked over the allowed tokens'
// span only: the same token, to the rounding of its block sums). -1 if an
// allowed token's log-prob is NaN or +inf, or none is finite.
int ConstrainedPick(const float* row, int64_t n, const SamplingPlan& plan, int first);

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_SAMPLING_KERNELS_H_
