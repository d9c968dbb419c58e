#include "model/txl_math.h"

#include <cmath>

namespace txl {

at::Tensor Embed(const ModelConfig& c, const TxlWeights& w, const at::Tensor& tokens) {
  const double scale = std::sqrt(static_cast<double>(c.d_model));
  if (c.div_val == 1) {
    at::Tensor e = at::embedding(w.emb_layers[0], tokens);
    if (!w.emb_projs.empty()) e = at::linear(e, w.emb_projs[0]);
    return e * scale;
  }
  // One table per bin; each token is looked up in its own bin.
  at::Tensor flat = tokens.reshape({-1});
  at::Tensor out = at::zeros({flat.size(0), c.d_model}, w.emb_layers[0].options());
  const std::vector<int64_t> ends = c.cutoff_ends();
  for (size_t i = 0; i + 1 < ends.size(); ++i) {
    at::Tensor idx = ((flat >= ends[i]) & (flat < ends[i + 1])).nonzero().squeeze(1);
    if (idx.numel() == 0) continue;
    at::Tensor e = at::embedding(w.emb_layers[i], flat.index_select(0, idx) - ends[i]);
    out.index_copy_(0, idx, at::linear(e, w.emb_projs[i]));
  }
  std::vector<int64_t> shape = tokens.sizes().vec();
  shape.push_back(c.d_model);
  return out.view(shape) * scale;
}

at::Tensor PositionEmbedding(const TxlWeights& w, const at::Tensor& distances) {
  at::Tensor s = at::outer(distances, w.inv_freq);
  return at::cat({s.sin(), s.cos()}, -1);
}

at::Tensor ClampedDistances(const ModelConfig& c, int64_t n, const at::TensorOptions& opts) {
  at::Tensor d = at::arange(static_cast<double>(n), opts.dtype(at::kFloat));
  if (c.clamp_len > 0) d.clamp_max_(static_cast<double>(c.clamp_len));
  return d;
}

at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, 1e-5);
}

at::Tensor FeedForward(const ModelConfig& c, const LayerWeights& L, const at::Tensor& x, double dropout, bool train) {
  auto core = [&](const at::Tensor& in) {
    at::Tensor h = at::relu(at::linear(in, L.ff1_w, L.ff1_b));
    h = at::dropout(h, dropout, train);
    return at::dropout(at::linear(h, L.ff2_w, L.ff2_b), dropout, train);
  };
  if (c.pre_lnorm) return x + core(LayerNorm(x, L.ff_ln_w, L.ff_ln_b));
  return LayerNorm(x + core(x), L.ff_ln_w, L.ff_ln_b);
}

namespace {

at::Tensor Logit(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& proj) {
  if (!proj.defined()) return at::linear(h, weight, bias);
  return at::linear(at::matmul(h, proj), weight, bias);
}

}  // namespace

at::Tensor LogProbs(const ModelConfig& c, const TxlWeights& w, const at::Tensor& hidden) {
  const int64_t nc = c.n_clusters();
  if (nc == 0) {
    return at::log_softmax(Logit(hidden, w.out_w[0], w.out_b[0], w.out_projs[0]), -1);
  }
  const std::vector<int64_t> ends = c.cutoff_ends();
  const bool div1 = c.div_val == 1;
  auto bin_weight = [&](int64_t i) { return div1 ? w.out_w[0].slice(0, ends[i], ends[i + 1]) : w.out_w[i]; };
  auto bin_bias = [&](int64_t i) { return div1 ? w.out_b[0].slice(0, ends[i], ends[i + 1]) : w.out_b[i]; };
  const int64_t shortlist = ends[1];
  at::Tensor head_w = at::cat({bin_weight(0), w.cluster_w}, 0);
  at::Tensor head_b = at::cat({bin_bias(0), w.cluster_b}, 0);
  at::Tensor head = at::log_softmax(Logit(hidden, head_w, head_b, w.out_projs[0]), -1);
  std::vector<at::Tensor> pieces = {head.slice(-1, 0, shortlist)};
  for (int64_t i = 1; i <= nc; ++i) {
    at::Tensor tail = at::log_softmax(Logit(hidden, bin_weight(i), bin_bias(i), w.out_projs[i]), -1);
    const int64_t col = c.tail_cluster_order == TailClusterOrder::kReversed ? shortlist + nc - i : shortlist + i - 1;
    pieces.push_back(tail + head.slice(-1, col, col + 1));
  }
  return at::cat(pieces, -1);
}

}  // namespace txl
