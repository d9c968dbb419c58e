// The training form of MemTransformerLM, as the original code computes it:
// segments of [qlen, bsz] tokens, memories of hidden states carried between
// segments without gradient, dropout when training.
#ifndef TXL_TRAIN_TRAINING_FORWARD_H_
#define TXL_TRAIN_TRAINING_FORWARD_H_

#include <ATen/ATen.h>

#include <vector>

#include "model/model_config.h"
#include "model/net/weights.h"

namespace txl {

struct SegmentOutput {
  at::Tensor hidden;             // [qlen, bsz, d_model], after the last layer
  std::vector<at::Tensor> mems;  // n_layer x [<= mem_len, bsz, d_model], detached
};

// tokens: [qlen, bsz] int64. mems: empty (no memory yet) or n_layer tensors
// [mlen, bsz, d_model] holding the input of each layer. With same_length the
// mask is the original's: each query sees at most mem_len keys incl. itself.
// (With mem_len == 0 the original same_length mask would mask everything;
// then only the causal mask applies.)
SegmentOutput TrainingForward(const ModelConfig& c, const TxlWeights& w, const at::Tensor& tokens,
                              const std::vector<at::Tensor>& mems, bool train);

}  // namespace txl

#endif  // TXL_TRAIN_TRAINING_FORWARD_H_
