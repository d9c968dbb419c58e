// TxlWeights: the tensors of a MemTransformerLM, typed, with the original
// code's names. Tied tensors (tie_weight, tie_projs) are one tensor reachable
// under both names, exactly as the original state_dict lists them.
#ifndef TXL_MODEL_NET_WEIGHTS_H_
#define TXL_MODEL_NET_WEIGHTS_H_

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"

namespace txl {

struct LayerWeights {
  at::Tensor qkv_w;                 // dec_attn.qkv_net.weight [3*H*dh, d]
  at::Tensor r_w;                   // dec_attn.r_net.weight [H*dh, d]
  at::Tensor o_w;                   // dec_attn.o_net.weight [d, H*dh]
  at::Tensor attn_ln_w, attn_ln_b;  // dec_attn.layer_norm
  at::Tensor ff1_w, ff1_b;          // pos_ff.CoreNet.0
  at::Tensor ff2_w, ff2_b;          // pos_ff.CoreNet.3
  at::Tensor ff_ln_w, ff_ln_b;      // pos_ff.layer_norm
};

struct TxlWeights {
  std::vector<at::Tensor> emb_layers;  // word_emb.emb_layers.i.weight
  std::vector<at::Tensor> emb_projs;   // word_emb.emb_projs.i (may be empty)
  std::vector<LayerWeights> layers;
  at::Tensor r_w_bias, r_r_bias;         // [H, dh], or [n_layer, H, dh] when untie_r
  at::Tensor inv_freq;                   // pos_emb.inv_freq [d_model / 2] (buffer)
  std::vector<at::Tensor> out_w, out_b;  // crit.out_layers.i.{weight,bias}
  std::vector<at::Tensor> out_projs;     // crit.out_projs.i; undefined = none
  at::Tensor cluster_w, cluster_b;       // crit.cluster_{weight,bias}

  // The u (content) and v (position) bias of layer `layer`, [H, dh].
  at::Tensor u(const ModelConfig& c, int64_t layer) const;
  at::Tensor v(const ModelConfig& c, int64_t layer) const;

  // Every tensor under its original name; tied tensors appear under both
  // names. Buffers (pos_emb.inv_freq) are flagged.
  struct Named {
    std::string name;
    at::Tensor tensor;
    bool is_buffer = false;
  };
  std::vector<Named> NamedTensors(const ModelConfig& c) const;

  // Learnable tensors, each once (tied ones deduplicated), for optimizers.
  std::vector<at::Tensor> Parameters(const ModelConfig& c) const;

  TxlWeights To(const at::Device& device) const;
};

// The name -> expected shape map the config implies (tied names included).
std::map<std::string, std::vector<int64_t>> ExpectedShapes(const ModelConfig& c);

// Fresh weights: normal(0, init_std) for matrices and biases u/v,
// projections normal(0, proj_init_std), layer norms weight 1 / bias 0,
// linear biases 0 (the original code's init scheme).
TxlWeights InitWeights(const ModelConfig& c, uint64_t seed, double init_std = 0.02, double proj_init_std = 0.01);

// Builds weights from named tensors, checking names and shapes against the
// config. `source` names the file in error messages.
absl::StatusOr<TxlWeights> WeightsFromNamed(const ModelConfig& c, const std::map<std::string, at::Tensor>& named,
                                            const std::string& source);

}  // namespace txl

#endif  // TXL_MODEL_NET_WEIGHTS_H_
