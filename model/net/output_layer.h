// The serving model's output layer (the projected adaptive softmax), with
// readouts that do not build [rows, n_token] log-prob rows: a target's
// log-prob, the most likely token, an exact draw. With clusters they work
// bin by bin, so their compute and copies follow the rows' clusters rather
// than the vocabulary, and only ids and log-probs leave the device. Each
// agrees with LogProbs' rows to float rounding (docs/MODEL.md, "Output
// readouts"). The head's weight (shortlist + cluster rows) is joined once
// here, not per step as txl_math.h's LogProbs (the trainer's) does.
#ifndef TXL_MODEL_NET_OUTPUT_LAYER_H_
#define TXL_MODEL_NET_OUTPUT_LAYER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "model/model_config.h"
#include "model/net/weights.h"
#include "model/step.h"

namespace txl {

struct TokenPicks {
  std::vector<int> ids;
  std::vector<float> logprobs;
};

class OutputLayer {
 public:
  // `w` on the device the hidden states will be on; its tensors are shared.
  OutputLayer(const ModelConfig& c, const TxlWeights& w);

  // [rows, n_token] log-probs in id order (what a sampler needs).
  at::Tensor LogProbs(const at::Tensor& hidden) const;
  // LogProbs where it matters for constrained picks (SamplingPlan::allowed):
  // allowed[r] the tokens row r may take. Only the clusters that hold one
  // of them, in some row, are computed; the columns of the others are -inf,
  // and the columns after the last such cluster are left out (the rows may
  // be narrower than n_token). The entries computed are LogProbs' own.
  // `head`, where given, is HeadLogProbs(hidden), computed once for several
  // readouts of the same rows (here and in BestTokens, DrawTokens).
  at::Tensor AllowedLogProbs(const at::Tensor& hidden, const std::vector<const AllowedTokens*>& allowed,
                             const at::Tensor& head = {}) const;

  // log p(targets[r] | hidden[r]); hidden [rows, d_model]. A row whose
  // target is in the shortlist reads only the head; one in a cluster adds
  // that cluster's logits, for the rows that need them.
  std::vector<float> TargetLogProbs(const at::Tensor& hidden, const std::vector<int>& targets) const;

  // The most likely token of each row (ties: the lower id) and its log-prob.
  // A cluster is computed only for the rows whose cluster entry in the head
  // is above their best word so far (no word of it can beat that otherwise).
  TokenPicks BestTokens(const at::Tensor& hidden, const at::Tensor& head = {}) const;

  // One draw per row at temperature 1: the first token in id order whose
  // cumulative probability exceeds uniforms[r] (in [0, 1)) times the total.
  // The head's entries are walked first (shortlist words, then one entry per
  // cluster in id order); only rows that land on a cluster compute its
  // logits.
  TokenPicks DrawTokens(const at::Tensor& hidden, const std::vector<double>& uniforms,
                        const at::Tensor& head = {}) const;

  // The n most likely tokens of each row, most likely first (ties: the lower
  // id): exactly the first n of the row sorted that way. Each bin gives its
  // top n by a partial selection; a cluster is computed only for rows whose
  // cluster entry beats their n-th best so far, as in BestTokens. Ties at a
  // bin's cut bring all the tied words, so the cut is made on the host.
  std::vector<TokenList> TopTokens(const at::Tensor& hidden, int n) const;

  // The head's log-probs, [rows, shortlist + clusters]: where every readout starts.
  at::Tensor HeadLogProbs(const at::Tensor& hidden) const;

 private:
  at::Tensor ClusterLogProbs(const at::Tensor& hidden, const at::Tensor& head, int64_t i) const;

  ModelConfig c_;
  TxlWeights w_;
  std::vector<int64_t> ends_;  // [0, cutoffs..., n_token]
  at::Tensor head_w_, head_b_;
};

}  // namespace txl

#endif  // TXL_MODEL_NET_OUTPUT_LAYER_H_
