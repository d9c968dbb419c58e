// Pieces of the Transformer-XL computation shared by the training form
// (training_forward.h) and the incremental form (incremental.h).
#ifndef TXL_MODEL_TXL_MATH_H_
#define TXL_MODEL_TXL_MATH_H_

#include <ATen/ATen.h>

#include "model/model_config.h"
#include "model/weights.h"

namespace txl {

// AdaptiveEmbedding: token ids (any shape, int64) -> [..., d_model],
// scaled by sqrt(d_model).
at::Tensor Embed(const ModelConfig& c, const TxlWeights& w, const at::Tensor& tokens);

// Sinusoid embedding of (already clamped) distances: [n] -> [n, d_model] =
// cat(sin(p * inv_freq), cos(p * inv_freq)).
at::Tensor PositionEmbedding(const TxlWeights& w, const at::Tensor& distances);

// Distances 0..n-1 as floats, clamped to clamp_len when clamp_len > 0.
at::Tensor ClampedDistances(const ModelConfig& c, int64_t n, const at::TensorOptions& opts);

// Position-wise feed-forward block with its residual and layer norm.
at::Tensor FeedForward(const ModelConfig& c, const LayerWeights& L, const at::Tensor& x, double dropout, bool train);

at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// ProjectedAdaptiveLogSoftmax: hidden [T, d_model] -> log-probs [T, n_token]
// over the whole vocabulary, in token-id order.
at::Tensor LogProbs(const ModelConfig& c, const TxlWeights& w, const at::Tensor& hidden);

}  // namespace txl

#endif  // TXL_MODEL_TXL_MATH_H_
