#include "model/net/weights.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace txl {
namespace {

enum class Init { kNormal, kProj, kLayerNormWeight, kZero, kInvFreq };

// One named tensor of the model: where it lives in TxlWeights, its shape,
// how it is initialised, and (for tied tensors) which name it shares.
struct Slot {
  std::string name;
  std::vector<int64_t> shape;
  at::Tensor* tensor;
  Init init;
  std::string tied_to = "";  // empty: owns its tensor
  bool buffer = false;
};

std::vector<Slot> Slots(const ModelConfig& c, TxlWeights* w) {
  std::vector<Slot> s;
  const int64_t d = c.d_model, hd = c.n_head * c.d_head;
  const std::vector<int64_t> ends = c.cutoff_ends();
  const int64_t n_bins = c.n_clusters() + 1;
  const bool div1 = c.div_val == 1;
  const int64_t n_tables = div1 ? 1 : n_bins;
  const bool div1_proj = div1 && c.embed_dim() != d;

  w->emb_layers.resize(n_tables);
  w->emb_projs.resize(div1 ? (div1_proj ? 1 : 0) : n_bins);
  for (int64_t i = 0; i < n_tables; ++i) {
    int64_t rows = div1 ? c.n_token : ends[i + 1] - ends[i];
    s.push_back(
        {absl::StrCat("word_emb.emb_layers.", i, ".weight"), {rows, c.bin_dim(i)}, &w->emb_layers[i], Init::kNormal});
  }
  for (size_t i = 0; i < w->emb_projs.size(); ++i) {
    s.push_back({absl::StrCat("word_emb.emb_projs.", i), {d, c.bin_dim(i)}, &w->emb_projs[i], Init::kProj});
  }
  s.push_back({"pos_emb.inv_freq", {d / 2}, &w->inv_freq, Init::kInvFreq, "", true});
  std::vector<int64_t> bias_shape = {c.n_head, c.d_head};
  if (c.untie_r) bias_shape.insert(bias_shape.begin(), c.n_layer);
  s.push_back({"r_w_bias", bias_shape, &w->r_w_bias, Init::kNormal});
  s.push_back({"r_r_bias", bias_shape, &w->r_r_bias, Init::kNormal});

  w->layers.resize(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w->layers[l];
    std::string a = absl::StrCat("layers.", l, ".dec_attn."), f = absl::StrCat("layers.", l, ".pos_ff.");
    s.push_back({a + "qkv_net.weight", {3 * hd, d}, &L.qkv_w, Init::kNormal});
    s.push_back({a + "r_net.weight", {hd, d}, &L.r_w, Init::kNormal});
    s.push_back({a + "o_net.weight", {d, hd}, &L.o_w, Init::kNormal});
    s.push_back({a + "layer_norm.weight", {d}, &L.attn_ln_w, Init::kLayerNormWeight});
    s.push_back({a + "layer_norm.bias", {d}, &L.attn_ln_b, Init::kZero});
    s.push_back({f + "CoreNet.0.weight", {c.d_inner, d}, &L.ff1_w, Init::kNormal});
    s.push_back({f + "CoreNet.0.bias", {c.d_inner}, &L.ff1_b, Init::kZero});
    s.push_back({f + "CoreNet.3.weight", {d, c.d_inner}, &L.ff2_w, Init::kNormal});
    s.push_back({f + "CoreNet.3.bias", {d}, &L.ff2_b, Init::kZero});
    s.push_back({f + "layer_norm.weight", {d}, &L.ff_ln_w, Init::kLayerNormWeight});
    s.push_back({f + "layer_norm.bias", {d}, &L.ff_ln_b, Init::kZero});
  }

  if (c.n_clusters() > 0) {
    s.push_back({"crit.cluster_weight", {c.n_clusters(), c.embed_dim()}, &w->cluster_w, Init::kNormal});
    s.push_back({"crit.cluster_bias", {c.n_clusters()}, &w->cluster_b, Init::kZero});
  }
  w->out_w.resize(n_tables);
  w->out_b.resize(n_tables);
  for (int64_t i = 0; i < n_tables; ++i) {
    int64_t rows = div1 ? c.n_token : ends[i + 1] - ends[i];
    s.push_back({absl::StrCat("crit.out_layers.", i, ".weight"),
                 {rows, c.bin_dim(i)},
                 &w->out_w[i],
                 Init::kNormal,
                 c.tie_weight ? absl::StrCat("word_emb.emb_layers.", i, ".weight") : ""});
    s.push_back({absl::StrCat("crit.out_layers.", i, ".bias"), {rows}, &w->out_b[i], Init::kZero});
  }
  // div_val == 1 has either a projection for every cluster or none at all.
  const bool has_out_projs = !div1 || div1_proj;
  w->out_projs.resize(n_bins);  // entries stay undefined when there are none
  if (has_out_projs) {
    for (int64_t i = 0; i < n_bins; ++i) {
      int64_t di = div1 ? c.embed_dim() : c.bin_dim(i);
      std::string tied;
      if (c.tie_proj(i)) tied = absl::StrCat("word_emb.emb_projs.", div1 ? 0 : i);
      s.push_back({absl::StrCat("crit.out_projs.", i), {d, di}, &w->out_projs[i], Init::kProj, tied});
    }
  }
  return s;
}

std::string ShapeStr(at::IntArrayRef shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

}  // namespace

at::Tensor TxlWeights::u(const ModelConfig& c, int64_t layer) const { return c.untie_r ? r_w_bias[layer] : r_w_bias; }
at::Tensor TxlWeights::v(const ModelConfig& c, int64_t layer) const { return c.untie_r ? r_r_bias[layer] : r_r_bias; }

std::vector<TxlWeights::Named> TxlWeights::NamedTensors(const ModelConfig& c) const {
  TxlWeights copy = *this;  // shallow: tensors are shared handles
  std::vector<Named> out;
  for (const Slot& s : Slots(c, &copy)) out.push_back({s.name, *s.tensor, s.buffer});
  return out;
}

std::vector<at::Tensor> TxlWeights::Parameters(const ModelConfig& c) const {
  TxlWeights copy = *this;
  std::vector<at::Tensor> out;
  for (const Slot& s : Slots(c, &copy)) {
    if (s.buffer || !s.tied_to.empty()) continue;
    out.push_back(*s.tensor);
  }
  return out;
}

TxlWeights TxlWeights::To(const at::Device& device) const {
  TxlWeights copy = *this;
  std::map<const void*, at::Tensor> moved;  // keeps tied tensors one tensor
  auto move_shared = [&](at::Tensor& t) {
    if (!t.defined()) return;
    const void* key = t.unsafeGetTensorImpl();
    auto it = moved.find(key);
    if (it != moved.end()) {
      t = it->second;
      return;
    }
    at::Tensor m = t.to(device);
    moved[key] = m;
    t = m;
  };
  for (auto& t : copy.emb_layers) move_shared(t);
  for (auto& t : copy.emb_projs) move_shared(t);
  for (auto& L : copy.layers) {
    for (at::Tensor* t : {&L.qkv_w, &L.r_w, &L.o_w, &L.attn_ln_w, &L.attn_ln_b, &L.ff1_w, &L.ff1_b, &L.ff2_w, &L.ff2_b,
                          &L.ff_ln_w, &L.ff_ln_b})
      move_shared(*t);
  }
  for (at::Tensor* t : {&copy.r_w_bias, &copy.r_r_bias, &copy.inv_freq, &copy.cluster_w, &copy.cluster_b})
    move_shared(*t);
  for (auto& t : copy.out_w) move_shared(t);
  for (auto& t : copy.out_b) move_shared(t);
  for (auto& t : copy.out_projs) move_shared(t);
  return copy;
}

std::map<std::string, std::vector<int64_t>> ExpectedShapes(const ModelConfig& c) {
  TxlWeights w;
  std::map<std::string, std::vector<int64_t>> out;
  for (const Slot& s : Slots(c, &w)) out[s.name] = s.shape;
  return out;
}

TxlWeights InitWeights(const ModelConfig& c, uint64_t seed, double init_std, double proj_init_std) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  TxlWeights w;
  std::map<std::string, at::Tensor> by_name;
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  for (Slot& s : Slots(c, &w)) {
    if (!s.tied_to.empty()) {
      *s.tensor = by_name.at(s.tied_to);
      by_name[s.name] = *s.tensor;
      continue;
    }
    at::Tensor t;
    switch (s.init) {
      case Init::kNormal: t = at::normal(0.0, init_std, s.shape, gen, opts); break;
      case Init::kProj: t = at::normal(0.0, proj_init_std, s.shape, gen, opts); break;
      case Init::kLayerNormWeight: t = at::normal(1.0, init_std, s.shape, gen, opts); break;
      case Init::kZero: t = at::zeros(s.shape, opts); break;
      case Init::kInvFreq:
        t = 1.0 / at::pow(10000.0,
                          at::arange(0.0, static_cast<double>(c.d_model), 2.0, opts) / static_cast<double>(c.d_model));
        break;
    }
    *s.tensor = t;
    by_name[s.name] = t;
  }
  return w;
}

absl::StatusOr<TxlWeights> WeightsFromNamed(const ModelConfig& c, const std::map<std::string, at::Tensor>& named,
                                            const std::string& source) {
  TxlWeights w;
  std::vector<Slot> slots = Slots(c, &w);
  std::set<std::string> known;
  for (const Slot& s : slots) known.insert(s.name);
  for (const auto& [name, t] : named) {
    if (!known.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": config contradicts the tensors: tensor '", name, "' ", ShapeStr(t.sizes()),
          " has no place in a model with n_layer=", c.n_layer, ", cutoffs=[", absl::StrJoin(c.cutoffs, ","),
          "], div_val=", c.div_val, ", d_embed=", c.embed_dim(), ", d_model=", c.d_model));
    }
  }
  std::map<std::string, at::Tensor> resolved;
  for (Slot& s : slots) {
    auto it = named.find(s.name);
    if (it == named.end()) {
      if (s.init == Init::kInvFreq) {  // derivable; some exports drop buffers
        *s.tensor = 1.0 / at::pow(10000.0, at::arange(0.0, static_cast<double>(c.d_model), 2.0, at::kFloat) /
                                               static_cast<double>(c.d_model));
        continue;
      }
      if (!s.tied_to.empty()) {
        *s.tensor = resolved.at(s.tied_to);
        resolved[s.name] = *s.tensor;
        continue;
      }
      return absl::NotFoundError(
          absl::StrCat(source, ": missing tensor '", s.name, "' (expected shape ", ShapeStr(s.shape), ")"));
    }
    at::Tensor t = it->second;
    if (t.sizes() != at::IntArrayRef(s.shape)) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", s.name, "' has shape ", ShapeStr(t.sizes()),
                                                     ", but the config implies ", ShapeStr(s.shape)));
    }
    if (!at::isFloatingType(t.scalar_type())) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor '", s.name, "' is not floating point (", c10::toString(t.scalar_type()), ")"));
    }
    t = t.detach().to(at::kCPU, at::kFloat).contiguous();
    if (!at::isfinite(t).all().item<bool>()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor '", s.name, "' has non-finite values (NaN or Inf)"));
    }
    if (!s.tied_to.empty()) {
      const at::Tensor& src = resolved.at(s.tied_to);
      if (!at::equal(src, t)) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": config contradicts the tensors: it ties '", s.name,
                                                       "' to '", s.tied_to,
                                                       "' (tie_weight/tie_projs) but their values differ"));
      }
      t = src;  // keep them one tensor
    }
    *s.tensor = t;
    resolved[s.name] = t;
  }
  return w;
}

}  // namespace txl
