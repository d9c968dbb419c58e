// ModelConfig: every hyperparameter of the original MemTransformerLM, under
// the original names, stored as JSON. Torch-free so any layer may use it.
#ifndef TXL_MODEL_MODEL_CONFIG_H_
#define TXL_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace txl {

// Which head column holds the log-prob of tail cluster i (1-based).
// The original PyTorch code reads column -i; TF and Hugging Face read
// cutoffs[0] + i - 1. They differ once there are two or more clusters.
enum class TailClusterOrder { kReversed, kSequential };

struct ModelConfig {
  int64_t n_token = 0;  // 0 until known (e.g. taken from the tokenizer)
  int64_t n_layer = 2;
  int64_t n_head = 2;
  int64_t d_model = 64;
  int64_t d_head = 32;
  int64_t d_inner = 256;
  int64_t d_embed = -1;  // -1: same as d_model (the original default)
  int64_t div_val = 1;
  std::vector<int64_t> cutoffs;  // adaptive softmax/embedding bin edges
  bool tie_weight = true;
  // One flag per cluster (cutoffs.size() + 1 entries); empty means all false.
  std::vector<bool> tie_projs;
  bool pre_lnorm = false;
  bool untie_r = false;  // per-layer u/v biases, stored as [n_layer, H, dh]
  int64_t mem_len = 64;
  int64_t clamp_len = -1;  // <= 0: no clamping
  bool same_length = true;
  double dropout = 0.0;
  double dropatt = 0.0;
  TailClusterOrder tail_cluster_order = TailClusterOrder::kReversed;

  // Resolved values.
  int64_t embed_dim() const { return d_embed > 0 ? d_embed : d_model; }
  int64_t n_clusters() const { return static_cast<int64_t>(cutoffs.size()); }
  // [0, cutoffs..., n_token]
  std::vector<int64_t> cutoff_ends() const;
  // Width of the embedding / output table of bin i.
  int64_t bin_dim(int64_t i) const;
  bool tie_proj(int64_t i) const { return i < static_cast<int64_t>(tie_projs.size()) && tie_projs[i]; }

  // Checks every field; the message names the field and the allowed range.
  absl::Status Validate() const;

  // Missing keys keep their defaults; unknown keys are an error (typos would
  // otherwise silently change the model).
  static absl::StatusOr<ModelConfig> FromJson(const std::string& json);
  std::string ToJson() const;
};

}  // namespace txl

#endif  // TXL_MODEL_MODEL_CONFIG_H_
