#include "model/model_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace txl {
namespace {

using json = nlohmann::json;

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("model config: ", field, " ", why));
}

template <typename T>
absl::Status Read(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  try {
    *out = it->get<T>();
  } catch (const json::exception& e) {
    return Invalid(key, absl::StrCat("has the wrong type: ", it->dump()));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> ModelConfig::cutoff_ends() const {
  std::vector<int64_t> ends = {0};
  ends.insert(ends.end(), cutoffs.begin(), cutoffs.end());
  ends.push_back(n_token);
  return ends;
}

int64_t ModelConfig::bin_dim(int64_t i) const {
  int64_t d = embed_dim();
  for (int64_t k = 0; k < i; ++k) d /= div_val;
  return d;
}

absl::Status ModelConfig::Validate() const {
  if (n_token < 1) return Invalid("n_token", absl::StrCat("must be >= 1, got ", n_token));
  if (n_layer < 1) return Invalid("n_layer", absl::StrCat("must be >= 1, got ", n_layer));
  if (n_head < 1) return Invalid("n_head", absl::StrCat("must be >= 1, got ", n_head));
  if (d_head < 1) return Invalid("d_head", absl::StrCat("must be >= 1, got ", d_head));
  if (d_model < 2 || d_model % 2 != 0)
    return Invalid("d_model", absl::StrCat("must be even and >= 2 (sinusoid halves), got ", d_model));
  if (d_inner < 1) return Invalid("d_inner", absl::StrCat("must be >= 1, got ", d_inner));
  if (d_embed == 0 || d_embed < -1)
    return Invalid("d_embed", absl::StrCat("must be >= 1, or -1 for d_model, got ", d_embed));
  if (div_val < 1) return Invalid("div_val", absl::StrCat("must be >= 1, got ", div_val));
  int64_t prev = 0;
  for (int64_t c : cutoffs) {
    if (c <= prev || c >= n_token)
      return Invalid("cutoffs", absl::StrCat("must be strictly increasing within (0, n_token=", n_token, "), got [",
                                             absl::StrJoin(cutoffs, ", "), "]"));
    prev = c;
  }
  if (div_val > 1) {
    for (int64_t i = 0; i <= n_clusters(); ++i) {
      if (bin_dim(i) < 1)
        return Invalid("div_val", absl::StrCat("leaves bin ", i, " with width 0 (d_embed=", embed_dim(),
                                               ", div_val=", div_val, ")"));
    }
  }
  if (!tie_projs.empty() && static_cast<int64_t>(tie_projs.size()) != n_clusters() + 1)
    return Invalid("tie_projs",
                   absl::StrCat("must have len(cutoffs)+1 = ", n_clusters() + 1, " entries, got ", tie_projs.size()));
  if (mem_len < 0) return Invalid("mem_len", absl::StrCat("must be >= 0, got ", mem_len));
  if (!(dropout >= 0.0 && dropout < 1.0)) return Invalid("dropout", absl::StrCat("must be in [0, 1), got ", dropout));
  if (!(dropatt >= 0.0 && dropatt < 1.0)) return Invalid("dropatt", absl::StrCat("must be in [0, 1), got ", dropatt));
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("model config: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("model config: JSON must be an object");
  static const char* kKeys[] = {"n_token",     "n_layer",   "n_head",  "d_model",           "d_head",
                                "d_inner",     "d_embed",   "div_val", "cutoffs",           "tie_weight",
                                "tie_projs",   "pre_lnorm", "untie_r", "mem_len",           "clamp_len",
                                "same_length", "dropout",   "dropatt", "tail_cluster_order"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* k : kKeys) known |= it.key() == k;
    if (!known) return Invalid(it.key(), "is not a known key");
  }
  ModelConfig c;
  RETURN_IF_ERROR(Read(j, "n_token", &c.n_token));
  RETURN_IF_ERROR(Read(j, "n_layer", &c.n_layer));
  RETURN_IF_ERROR(Read(j, "n_head", &c.n_head));
  RETURN_IF_ERROR(Read(j, "d_model", &c.d_model));
  RETURN_IF_ERROR(Read(j, "d_head", &c.d_head));
  RETURN_IF_ERROR(Read(j, "d_inner", &c.d_inner));
  RETURN_IF_ERROR(Read(j, "d_embed", &c.d_embed));
  RETURN_IF_ERROR(Read(j, "div_val", &c.div_val));
  RETURN_IF_ERROR(Read(j, "cutoffs", &c.cutoffs));
  RETURN_IF_ERROR(Read(j, "tie_weight", &c.tie_weight));
  RETURN_IF_ERROR(Read(j, "pre_lnorm", &c.pre_lnorm));
  RETURN_IF_ERROR(Read(j, "untie_r", &c.untie_r));
  RETURN_IF_ERROR(Read(j, "mem_len", &c.mem_len));
  RETURN_IF_ERROR(Read(j, "clamp_len", &c.clamp_len));
  RETURN_IF_ERROR(Read(j, "same_length", &c.same_length));
  RETURN_IF_ERROR(Read(j, "dropout", &c.dropout));
  RETURN_IF_ERROR(Read(j, "dropatt", &c.dropatt));
  if (auto it = j.find("tie_projs"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Invalid("tie_projs", "must be a list of booleans");
    for (const auto& v : *it) {
      if (!v.is_boolean()) return Invalid("tie_projs", "must be a list of booleans");
      c.tie_projs.push_back(v.get<bool>());
    }
  }
  std::string order = "reversed";
  RETURN_IF_ERROR(Read(j, "tail_cluster_order", &order));
  if (order == "reversed") {
    c.tail_cluster_order = TailClusterOrder::kReversed;
  } else if (order == "sequential") {
    c.tail_cluster_order = TailClusterOrder::kSequential;
  } else {
    return Invalid("tail_cluster_order", absl::StrCat("must be \"reversed\" (original PyTorch) or \"sequential\" "
                                                      "(TF / Hugging Face), got \"",
                                                      order, "\""));
  }
  return c;
}

std::string ModelConfig::ToJson() const {
  json j;
  j["n_token"] = n_token;
  j["n_layer"] = n_layer;
  j["n_head"] = n_head;
  j["d_model"] = d_model;
  j["d_head"] = d_head;
  j["d_inner"] = d_inner;
  j["d_embed"] = d_embed;
  j["div_val"] = div_val;
  j["cutoffs"] = cutoffs;
  j["tie_weight"] = tie_weight;
  j["tie_projs"] = tie_projs;
  j["pre_lnorm"] = pre_lnorm;
  j["untie_r"] = untie_r;
  j["mem_len"] = mem_len;
  j["clamp_len"] = clamp_len;
  j["same_length"] = same_length;
  j["dropout"] = dropout;
  j["dropatt"] = dropatt;
  j["tail_cluster_order"] = tail_cluster_order == TailClusterOrder::kReversed ? "reversed" : "sequential";
  return j.dump(2);
}

}  // namespace txl
