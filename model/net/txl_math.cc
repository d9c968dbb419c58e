#include "model/net/txl_math.h"

#include <cmath>

namespace txl {

at::Tensor Embed(const ModelConfig& c, const TxlWeights& w, const at::Tensor& tokens) {
  const double scale = std::sqrt(static_cast<double>(c.d_model));
  if (c.div_val == 1) {
    at::Tensor e = at::embedding(w.emb_layers[0], tokens);
    if (!w.emb_projs.empty()) e = at::linear(e, w.emb_projs[0]);
    return e * scale;
  }
  // One table per bin; each token is looked up in its own bin. Every token
  // goes through every bin (clamped into it) and a mask keeps its own: no
  // nonzero(), whose data-dependent size would make a GPU wait for the host
  // each step. The other bins add exact zeros, so the sum is the lookup.
  at::Tensor flat = tokens.reshape({-1});
  at::Tensor out = at::zeros({flat.size(0), c.d_model}, w.emb_layers[0].options());
  const std::vector<int64_t> ends = c.cutoff_ends();
  for (size_t i = 0; i + 1 < ends.size(); ++i) {
    at::Tensor in_bin = ((flat >= ends[i]) & (flat < ends[i + 1])).unsqueeze(1).to(out.scalar_type());
    at::Tensor e = at::embedding(w.emb_layers[i], (flat - ends[i]).clamp(0, ends[i + 1] - ends[i] - 1));
    out = out + at::linear(e, w.emb_projs[i]) * in_bin;
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
  return at::layer_norm(x, {x.size(-1)}, weight, bias, kLayerNormEps);
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

at::Tensor ProjectedLinear(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& proj) {
  if (!proj.defined()) return at::linear(h, weight, bias);
  return at::linear(at::matmul(h, proj), weight, bias);
}

at::Tensor BinLogits(const ModelConfig& c, const TxlWeights& w, const at::Tensor& hidden, int64_t bin) {
  if (c.n_clusters() == 0 || c.div_val != 1)
    return ProjectedLinear(hidden, w.out_w[bin], w.out_b[bin], w.out_projs[bin]);
  const std::vector<int64_t> ends = c.cutoff_ends();
  return ProjectedLinear(hidden, w.out_w[0].slice(0, ends[bin], ends[bin + 1]),
                         w.out_b[0].slice(0, ends[bin], ends[bin + 1]), w.out_projs[bin]);
}

std::pair<at::Tensor, at::Tensor> HeadWeights(const ModelConfig& c, const TxlWeights& w) {
  if (c.n_clusters() == 0) return {w.out_w[0], w.out_b[0]};
  const int64_t shortlist = c.cutoff_ends()[1];
  const bool div1 = c.div_val == 1;
  return {at::cat({div1 ? w.out_w[0].slice(0, 0, shortlist) : w.out_w[0], w.cluster_w}, 0),
          at::cat({div1 ? w.out_b[0].slice(0, 0, shortlist) : w.out_b[0], w.cluster_b}, 0)};
}

int64_t ClusterColumn(const ModelConfig& c, int64_t i) {
  const int64_t shortlist = c.cutoff_ends()[1], nc = c.n_clusters();
  return c.tail_cluster_order == TailClusterOrder::kReversed ? shortlist + nc - i : shortlist + i - 1;
}

at::Tensor LogProbs(const ModelConfig& c, const TxlWeights& w, const at::Tensor& hidden) {
  const auto [head_w, head_b] = HeadWeights(c, w);
  at::Tensor head = at::log_softmax(ProjectedLinear(hidden, head_w, head_b, w.out_projs[0]), -1);
  const int64_t nc = c.n_clusters();
  if (nc == 0) return head;
  const int64_t shortlist = c.cutoff_ends()[1];
  std::vector<at::Tensor> pieces = {head.slice(-1, 0, shortlist)};
  for (int64_t i = 1; i <= nc; ++i) {
    const int64_t col = ClusterColumn(c, i);
    pieces.push_back(at::log_softmax(BinLogits(c, w, hidden, i), -1) + head.slice(-1, col, col + 1));
  }
  return at::cat(pieces, -1);
}

}  // namespace txl
