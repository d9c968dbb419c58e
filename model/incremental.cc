#include "model/incremental.h"

#include <algorithm>
#include <cmath>

#include "model/txl_math.h"

namespace txl {

int64_t SessionMemory::bytes() const {
  int64_t total = 0;
  for (const auto* list : {&k_, &v_})
    for (const at::Tensor& t : *list)
      if (t.defined()) total += t.numel() * t.element_size();
  return total;
}

SessionMemory SessionMemory::Clone() const {
  SessionMemory copy(static_cast<int64_t>(k_.size()), mem_len_);
  copy.position_ = position_;
  copy.length_ = length_;
  for (size_t l = 0; l < k_.size(); ++l) {
    if (k_[l].defined()) copy.k_[l] = k_[l].clone();
    if (v_[l].defined()) copy.v_[l] = v_[l].clone();
  }
  return copy;
}

// A session's memory as it evolves during one step; committed at the end.
struct IncrementalModel::Pending {
  SessionMemory* memory;
  int64_t length;
  std::vector<at::Tensor> k, v;
};

IncrementalModel::IncrementalModel(ModelConfig config, TxlWeights weights, at::Device device)
    : config_(std::move(config)), weights_(weights.To(device)), device_(device) {}

void IncrementalModel::EnsureRelTable(int64_t distances) {
  if (distances <= rel_size_) return;
  // Grow geometrically so that sessions with rising mem_len rebuild rarely.
  const int64_t size = std::max({distances, 2 * rel_size_, config_.mem_len});
  at::Tensor pos = PositionEmbedding(
      weights_, ClampedDistances(config_, size, at::TensorOptions().device(device_)));
  rel_k_.clear();
  for (const LayerWeights& L : weights_.layers)
    rel_k_.push_back(at::linear(pos, L.r_w).view({size, config_.n_head, config_.d_head}));
  rel_size_ = size;
}

at::Tensor IncrementalModel::Step(absl::Span<StepItem> items) {
  std::vector<Pending> pending;
  pending.reserve(items.size());
  int64_t max_n = 0;
  for (StepItem& item : items) {
    pending.push_back({item.memory, item.memory->length_, item.memory->k_, item.memory->v_});
    max_n = std::max<int64_t>(max_n, item.tokens.size());
  }
  std::vector<std::vector<at::Tensor>> parts(items.size());
  for (int64_t start = 0; start < max_n; start += kPassTokens) {
    std::vector<Pending*> batch;
    std::vector<std::vector<int64_t>> tokens;
    std::vector<size_t> which;
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& t = items[i].tokens;
      const int64_t n = static_cast<int64_t>(t.size());
      if (start >= n) continue;
      batch.push_back(&pending[i]);
      tokens.emplace_back(t.begin() + start, t.begin() + std::min(n, start + kPassTokens));
      which.push_back(i);
    }
    at::Tensor hidden = Pass(batch, tokens);
    int64_t offset = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      const int64_t n = static_cast<int64_t>(tokens[b].size());
      parts[which[b]].push_back(hidden.slice(0, offset, offset + n));
      offset += n;
    }
  }
  // Commit: nothing above touched the sessions.
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < items.size(); ++i) {
    SessionMemory* mem = items[i].memory;
    mem->k_ = std::move(pending[i].k);
    mem->v_ = std::move(pending[i].v);
    mem->length_ = pending[i].length;
    mem->position_ += static_cast<int64_t>(items[i].tokens.size());
    for (at::Tensor& p : parts[i]) all.push_back(std::move(p));
  }
  if (all.empty()) return at::empty({0, config_.d_model}, at::TensorOptions().device(device_));
  return all.size() == 1 ? all[0] : at::cat(all, 0);
}

at::Tensor IncrementalModel::Pass(std::vector<Pending*>& batch,
                                  const std::vector<std::vector<int64_t>>& tokens) {
  const ModelConfig& c = config_;
  const int64_t B = static_cast<int64_t>(batch.size()), H = c.n_head, dh = c.d_head;
  std::vector<int64_t> n(B), m(B), M(B), K(B), flat, rows;
  int64_t N = 0, Kmax = 0, maxM = 0;
  for (int64_t b = 0; b < B; ++b) {
    n[b] = static_cast<int64_t>(tokens[b].size());
    m[b] = batch[b]->length;
    M[b] = batch[b]->memory->mem_len();
    K[b] = m[b] + n[b];
    N = std::max(N, n[b]);
    Kmax = std::max(Kmax, K[b]);
    maxM = std::max(maxM, M[b]);
    flat.insert(flat.end(), tokens[b].begin(), tokens[b].end());
  }
  const int64_t T = static_cast<int64_t>(flat.size());
  const bool uniform = std::all_of(n.begin(), n.end(), [N](int64_t x) { return x == N; });
  if (!uniform) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n[b]; ++i) rows.push_back(b * N + i);
  }
  const int64_t D = std::min(Kmax, maxM);  // distances that can be attended
  EnsureRelTable(D);

  const auto lopt = at::TensorOptions().dtype(at::kLong);
  auto to_dev = [&](const std::vector<int64_t>& v) { return at::tensor(v, lopt).to(device_); };
  at::Tensor x = Embed(c, weights_, to_dev(flat));  // [T, d]
  const auto fopt = x.options();

  // Geometry of the padded [B, N queries, Kmax keys] score block. Key j of
  // session b is at distance m_b + i - j from its query i.
  at::Tensor nt = to_dev(n).view({B, 1, 1}), mt = to_dev(m).view({B, 1, 1});
  at::Tensor Mt = to_dev(M).view({B, 1, 1});
  at::Tensor qi = at::arange(N, lopt.device(device_)).view({1, N, 1});
  at::Tensor kj = at::arange(Kmax, lopt.device(device_)).view({1, 1, Kmax});
  at::Tensor dist = mt + qi - kj;
  // Padded query rows stay unmasked so their softmax is finite; they are dropped.
  at::Tensor masked = ((kj >= mt + nt) | (dist < 0) | (dist >= Mt)) & (qi < nt);
  masked = masked.unsqueeze(1);                                     // [B, 1, N, Kmax]
  at::Tensor gather_idx = dist.clamp(0, D - 1).unsqueeze(1).expand({B, H, N, Kmax});
  at::Tensor row_idx = uniform ? at::Tensor() : to_dev(rows);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = weights_.layers[l];
    at::Tensor h = c.pre_lnorm ? LayerNorm(x, L.attn_ln_w, L.attn_ln_b) : x;
    at::Tensor qkv = at::linear(h, L.qkv_w).view({T, 3, H, dh});
    at::Tensor q = qkv.select(1, 0), k = qkv.select(1, 1), v = qkv.select(1, 2);

    at::Tensor Qp = uniform ? q.reshape({B, N, H, dh})
                            : at::zeros({B * N, H, dh}, fopt).index_copy_(0, row_idx, q).view({B, N, H, dh});
    at::Tensor Kp, Vp;
    if (B == 1) {
      Kp = (m[0] > 0 ? at::cat({batch[0]->k[l], k}, 0) : k.contiguous()).unsqueeze(0);
      Vp = (m[0] > 0 ? at::cat({batch[0]->v[l], v}, 0) : v.contiguous()).unsqueeze(0);
    } else {
      Kp = at::zeros({B, Kmax, H, dh}, fopt);
      Vp = at::zeros({B, Kmax, H, dh}, fopt);
      int64_t offset = 0;
      for (int64_t b = 0; b < B; ++b) {
        if (m[b] > 0) {
          Kp[b].slice(0, 0, m[b]).copy_(batch[b]->k[l]);
          Vp[b].slice(0, 0, m[b]).copy_(batch[b]->v[l]);
        }
        Kp[b].slice(0, m[b], K[b]).copy_(k.slice(0, offset, offset + n[b]));
        Vp[b].slice(0, m[b], K[b]).copy_(v.slice(0, offset, offset + n[b]));
        offset += n[b];
      }
    }

    at::Tensor ac = at::matmul((Qp + weights_.u(c, l)).permute({0, 2, 1, 3}), Kp.permute({0, 2, 3, 1}));
    at::Tensor bd_all = at::matmul((Qp + weights_.v(c, l)).permute({0, 2, 1, 3}),
                                   rel_k_[l].slice(0, 0, D).permute({1, 2, 0}));  // [B,H,N,D]
    at::Tensor score = (ac + bd_all.gather(3, gather_idx)).mul_(scale);
    score.masked_fill_(masked, -INFINITY);
    at::Tensor prob = at::softmax(score, -1);
    at::Tensor vec = at::matmul(prob, Vp.permute({0, 2, 1, 3})).permute({0, 2, 1, 3}).reshape({B * N, H * dh});
    if (!uniform) vec = vec.index_select(0, row_idx);
    at::Tensor out = at::linear(vec, L.o_w);
    x = c.pre_lnorm ? x + out : LayerNorm(x + out, L.attn_ln_w, L.attn_ln_b);
    x = FeedForward(c, L, x, 0.0, false);

    // The window needs mem_len - 1 earlier keys; keep exactly those.
    for (int64_t b = 0; b < B; ++b) {
      const int64_t keep = std::min(M[b] - 1, K[b]);
      Pending* p = batch[b];
      if (keep <= 0) {
        p->k[l] = at::Tensor();
        p->v[l] = at::Tensor();
      } else {
        p->k[l] = Kp[b].slice(0, K[b] - keep, K[b]).clone();
        p->v[l] = Vp[b].slice(0, K[b] - keep, K[b]).clone();
      }
    }
  }
  for (int64_t b = 0; b < B; ++b) batch[b]->length = std::max<int64_t>(0, std::min(M[b] - 1, K[b]));
  return x;
}

}  // namespace txl
