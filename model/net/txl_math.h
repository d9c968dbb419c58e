// Pieces of the Transformer-XL computation shared by the training form
// (training_forward.h) and the incremental form (incremental.h).
#ifndef TXL_MODEL_NET_TXL_MATH_H_
#define TXL_MODEL_NET_TXL_MATH_H_

#include <ATen/ATen.h>

#include <utility>

#include "model/model_config.h"
#include "model/net/weights.h"

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

// The original's nn.LayerNorm epsilon.
constexpr double kLayerNormEps = 1e-5;
at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// ProjectedAdaptiveLogSoftmax: hidden [T, d_model] -> log-probs [T, n_token]
// over the whole vocabulary, in token-id order.
at::Tensor LogProbs(const ModelConfig& c, const TxlWeights& w, const at::Tensor& hidden);

// Its parts (model/net/output_layer.h reads them bin by bin): h proj^T W^T + b
// (no projection when proj is undefined); the logits of bin `bin` (cluster
// `bin`'s words; with no clusters, bin 0 is the whole vocabulary); the head's
// weight and bias (the shortlist's rows, then one row per cluster), joined;
// the head column of cluster i (1-based).
at::Tensor ProjectedLinear(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& proj);
at::Tensor BinLogits(const ModelConfig& c, const TxlWeights& w, const at::Tensor& hidden, int64_t bin);
std::pair<at::Tensor, at::Tensor> HeadWeights(const ModelConfig& c, const TxlWeights& w);
int64_t ClusterColumn(const ModelConfig& c, int64_t i);

}  // namespace txl

#endif  // TXL_MODEL_NET_TXL_MATH_H_
