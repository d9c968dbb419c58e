// A decode step (every session feeds one token) through every layer, as one
// parallel region: the caller (incremental.cc) runs DecodeStepLayers (one
// session) or DecodeBatchLayers (several) on each thread of a single
// at::parallel_for over `parts`, and the phases meet at a TeamBarrier.
// Waking the pool for each product, 24 to 60 times a step for the base
// model, cost a sixth of a one-session bf16 step and more than a quarter of
// a 32-session step's products (docs/OPTIMISATIONS.md, "One parallel region per
// one-session step" and "One parallel region for steps of several sessions
// too").
// Torch-free. The kernels and their partial sums are those of the
// several-region step before it; only the layer norms are computed here.
#ifndef TXL_MODEL_KERNELS_DECODE_STEP_H_
#define TXL_MODEL_KERNELS_DECODE_STEP_H_

#include <atomic>
#include <cstdint>

#include "model/kernels/decode_kernels.h"
#include "model/kernels/team_barrier.h"

namespace txl {

struct DecodeStepLayer {
  WeightMatrix qkv, o, ff1, ff2;  // as stored: [3 H dh, d], [d, H dh], [d_inner, d], [d, d_inner]
  const float* ff1_b;
  const float* ff2_b;
  const float* attn_ln_w;
  const float* attn_ln_b;
  const float* ff_ln_w;
  const float* ff_ln_b;
  const float* u;  // [H, dh] attention biases (DecodeAttentionArgs)
  const float* v;
  const void* rel;                // this layer's position rows (DecodeAttentionArgs::rel)
  const DecodeSession* sessions;  // [batch]: each session's rings of this layer
  PackedMatrix packed[4];         // several sessions: the four matrices packed in panels
};

struct DecodeStepArgs {
  const DecodeStepLayer* layers;
  int64_t n_layer, d_model, d_inner;
  bool pre_lnorm;
  // Shape, scale and types of the attention; its per-layer and buffer
  // fields are set here.
  DecodeAttentionArgs attention;
  int64_t parts;      // <= n_head and <= d_inner
  int64_t batch = 1;  // sessions
  float* x;           // [batch, d_model]: the embeddings in, the last layer's outputs out
  float* scratch;     // DecodeStepScratch(args) floats
  // batch > 1: per layer, the attention items claimed so far (zero before
  // the step).
  std::atomic<int64_t>* claimed = nullptr;
};

int64_t DecodeStepScratch(const DecodeStepArgs& args);

// The parts [begin, end) of every phase, for one thread of the region.
// batch == 1, per layer: each part projects its heads' query, key and value
// rows, attends with them and computes its share of the output projection;
// then its block of the inner layer and that block's share of the second
// product. The thread that runs part 0 sums the shares, adds the residual
// and applies the layer norms between the phases.
void DecodeStepLayers(const DecodeStepArgs& args, int64_t begin, int64_t end, TeamBarrier& barrier,
                      KernelIsa isa = KernelIsa::kBest);

// batch > 1: every product from the packed weights, split by panels; the
// attention's (session, head) items claimed a few at a time, so that a
// thread the OS preempts leaves the rest of them to the others; residuals
// and layer norms split by sessions. Seven barriers per layer instead of
// five parallel regions.
void DecodeBatchLayers(const DecodeStepArgs& args, int64_t begin, int64_t end, TeamBarrier& barrier,
                       KernelIsa isa = KernelIsa::kBest);

}  // namespace txl

#endif  // TXL_MODEL_KERNELS_DECODE_STEP_H_
