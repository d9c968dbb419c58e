// IncrementalModel::Pass: several tokens per session (prefills), in parts.
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "model/kernels/prefill_kernels.h"
#include "model/kernels/residual_layer_norm.h"
#include "model/kernels/skinny_product.h"
#include "model/kernels/split_decode_attention.h"
#include "model/net/cuda_launch.h"
#include "model/net/incremental.h"
#include "model/net/incremental_pass.h"
#include "model/net/txl_math.h"

// at::scaled_dot_product_attention with its scale argument: libtorch 2.1 on.
#define TXL_TORCH_HAS_SDPA (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))

namespace txl {

namespace {

// Queries per block of a long one-session prefill (BlockedAttention): small
// enough that a block's score rows span little more than the window, large
// enough for efficient products.
constexpr int64_t kQueryBlock = 128;

// The scores' scale, 1 / sqrt(dh).
double ScoreScale(int64_t dh) { return 1.0 / std::sqrt(static_cast<double>(dh)); }

}  // namespace

IncrementalModel::PassGeometry IncrementalModel::Geometry(const std::vector<Pending*>& batch,
                                                          const std::vector<std::vector<int64_t>>& tokens) const {
  PassGeometry g;
  const int64_t B = static_cast<int64_t>(batch.size());
  g.B = B;
  g.n.resize(B);
  g.m.resize(B);
  g.M.resize(B);
  g.K.resize(B);
  int64_t maxM = 0;
  for (int64_t b = 0; b < B; ++b) {
    g.n[b] = static_cast<int64_t>(tokens[b].size());
    g.m[b] = batch[b]->length;
    g.M[b] = batch[b]->memory->mem_len();
    g.K[b] = g.m[b] + g.n[b];
    g.N = std::max(g.N, g.n[b]);
    g.Kmax = std::max(g.Kmax, g.K[b]);
    maxM = std::max(maxM, g.M[b]);
    g.flat.insert(g.flat.end(), tokens[b].begin(), tokens[b].end());
  }
  g.T = static_cast<int64_t>(g.flat.size());
  const int64_t N = g.N;
  g.uniform = std::all_of(g.n.begin(), g.n.end(), [N](int64_t x) { return x == N; });
  if (!g.uniform) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < g.n[b]; ++i) g.rows.push_back(b * N + i);
  }
  g.D = std::min(g.Kmax, maxM);
  g.in_place.resize(B);
  for (int64_t b = 0; b < B; ++b) {
    const Pending* p = batch[b];
    const SessionMemory* s = p->memory;
    // A pooled memory is always written in place: Step's RingBackup kept
    // the committed rows its passes overwrite.
    g.in_place[b] =
        !p->replaced() && (s->pool_ != nullptr || (p->position + g.n[b]) - (s->position_ - s->length_) <= g.M[b]);
  }
  return g;
}

IncrementalModel::PoolPlan IncrementalModel::PlanPool(const std::vector<Pending*>& batch, const PassGeometry& g) const {
  PoolPlan plan;
  plan.gather =
      pool_ != nullptr && std::none_of(batch.begin(), batch.end(), [](const Pending* p) { return p->replaced(); });
  if (!plan.gather) return plan;
  // One token a session: its slot holds no position the pass reads (a window
  // keeps M - 1), so it is written first and gathered with the held rows.
  // Several: a new key's slot may hold a key that an earlier query of the
  // pass still reads, so every new key is laid over the gathered block and
  // written after the gather, only those the window keeps.
  plan.write_after_gather = !(g.N == 1 && g.uniform);
  const int64_t Kmax = g.Kmax;
  plan.gather_rows.assign(g.B * Kmax, SlotPool::kPadRow);
  int64_t offset = 0;
  for (int64_t b = 0; b < g.B; ++b) {
    const Pending* p = batch[b];
    const int64_t n = g.n[b], m = g.m[b];
    const bool pooled = g.in_place[b] && g.M[b] > 1;
    PoolRows(*p->memory, p->position - m, m, plan.gather_rows.data() + b * Kmax);
    // The new positions the window keeps: the last min(M - 1, m + n).
    const int64_t kept = pooled ? std::min(n, std::min(g.M[b] - 1, g.K[b])) : 0;
    const std::vector<int64_t> new_rows = PoolRows(*p->memory, p->position + n - kept, kept);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = i - (n - kept);  // its index among the kept, if it is one
      if (k >= 0) {
        plan.write_rows.push_back(new_rows[k]);
        plan.write_tok.push_back(offset + i);
      }
      if (k >= 0 && !plan.write_after_gather) {
        plan.gather_rows[b * Kmax + m + i] = new_rows[k];
      } else {
        plan.patch_rows.push_back(b * Kmax + m + i);
        plan.patch_tok.push_back(offset + i);
      }
    }
    offset += n;
  }
  return plan;
}

std::vector<const std::vector<int64_t>*> IncrementalModel::MetaParts(const PassGeometry& g,
                                                                     const PoolPlan& plan) const {
  std::vector<const std::vector<int64_t>*> parts = {&g.flat, &g.rows};
  if (generic_) parts.insert(parts.end(), {&g.n, &g.m, &g.M});
  if (plan.gather) {
    parts.insert(parts.end(),
                 {&plan.gather_rows, &plan.write_rows, &plan.write_tok, &plan.patch_rows, &plan.patch_tok});
  }
  return parts;
}

int64_t IncrementalModel::MetaCount(const PassGeometry& g, const PoolPlan& plan) const {
  int64_t count = 0;
  for (const std::vector<int64_t>* part : MetaParts(g, plan)) count += static_cast<int64_t>(part->size());
  return count;
}

void IncrementalModel::PackMeta(const PassGeometry& g, const PoolPlan& plan, int64_t* out) const {
  for (const std::vector<int64_t>* part : MetaParts(g, plan)) out = std::copy(part->begin(), part->end(), out);
}

std::vector<int64_t> IncrementalModel::PackMeta(const PassGeometry& g, const PoolPlan& plan) const {
  std::vector<int64_t> meta(MetaCount(g, plan));
  PackMeta(g, plan, meta.data());
  return meta;
}

IncrementalModel::PassMeta IncrementalModel::UploadMeta(const PassGeometry& g, const PoolPlan& plan) const {
  return DeriveMeta(g, plan, Upload(PackMeta(g, plan), device_));
}

IncrementalModel::PassMeta IncrementalModel::DeriveMeta(const PassGeometry& g, const PoolPlan& plan,
                                                        const at::Tensor& on_device) const {
  const int64_t B = g.B, N = g.N, Kmax = g.Kmax, H = config_.n_head;
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  int64_t meta_at = 0;
  auto next = [&](int64_t len) {
    at::Tensor t = on_device.slice(0, meta_at, meta_at + len);
    meta_at += len;
    return t;
  };
  PassMeta d;
  d.tokens = next(g.T);
  d.row_idx = next(static_cast<int64_t>(g.rows.size()));  // empty when uniform
  // Geometry of the padded [B, N queries, Kmax keys] score block: key j of
  // session b is at distance m_b + i - j from its query i. The tensor-op
  // softmax needs it as a mask and position indices; the CPU's fused kernel
  // (prefill_kernels.h) derives both from m, n and M itself.
  if (generic_) {
    const at::Tensor fed = next(B);
    d.held = next(B);
    d.window = next(B);
    if (SplitDecodeRuns(g, plan)) {  // SplitDecode masks and finds the distances itself
      if (cuda_kernels_)
        d.split_done = at::zeros({config_.n_layer, B * H}, at::TensorOptions().dtype(at::kInt).device(device_));
    } else {
      const at::Tensor nt = fed.view({B, 1, 1}), mt = d.held.view({B, 1, 1}), Mt = d.window.view({B, 1, 1});
      at::Tensor qi = at::arange(N, lopt.device(device_)).view({1, N, 1});
      at::Tensor kj = at::arange(Kmax, lopt.device(device_)).view({1, 1, Kmax});
      at::Tensor dist = mt + qi - kj;
      // Padded query rows stay unmasked so their softmax is finite; they are dropped.
      d.masked = (((kj >= mt + nt) | (dist < 0) | (dist >= Mt)) & (qi < nt)).unsqueeze(1);  // [B, 1, N, Kmax]
      d.gather_idx = dist.clamp(0, g.D - 1).unsqueeze(1).expand({B, H, N, Kmax});
    }
  }
  if (plan.gather) {
    d.gather_rows = next(B * Kmax);
    d.write_rows = next(static_cast<int64_t>(plan.write_rows.size()));
    d.write_tok = next(static_cast<int64_t>(plan.write_tok.size()));
    d.patch_rows = next(static_cast<int64_t>(plan.patch_rows.size()));
    d.patch_tok = next(static_cast<int64_t>(plan.patch_tok.size()));
  }
  return d;
}

at::Tensor IncrementalModel::Held(const Pending& p, int64_t l, bool key) const {
  if (p.replaced()) return key ? p.k[l] : p.v[l];
  return HeldRows(*p.memory, l, key, p.position - p.length, p.length).to(StreamType());
}

void IncrementalModel::WriteInPlace(const std::vector<Pending*>& batch, const PassGeometry& g, int64_t l,
                                    const at::Tensor& k, const at::Tensor& v) const {
  int64_t offset = 0;
  for (int64_t b = 0; b < g.B; ++b) {
    const int64_t n = g.n[b];
    if (g.in_place[b] && g.M[b] > 1) {
      WriteRows(*batch[b]->memory, l, true, batch[b]->position, k.slice(0, offset, offset + n));
      WriteRows(*batch[b]->memory, l, false, batch[b]->position, v.slice(0, offset, offset + n));
    }
    offset += n;
  }
}

std::pair<at::Tensor, at::Tensor> IncrementalModel::GatherKeys(const std::vector<Pending*>& batch,
                                                               const PassGeometry& g, const PoolPlan& plan,
                                                               const PassMeta& meta, int64_t l, const at::Tensor& k,
                                                               const at::Tensor& v,
                                                               const at::TensorOptions& fopt) const {
  const int64_t B = g.B, Kmax = g.Kmax, H = config_.n_head, dh = config_.d_head;
  at::Tensor Kp, Vp;
  if (plan.gather) {  // the pool plan: every session's keys out, the new ones laid over or written first
    if (!plan.write_after_gather) WritePool(plan, meta, l, k, v);
    for (const bool key : {true, false}) {
      const at::Tensor& pool = key ? pool_->keys(l) : pool_->values(l);
      const at::Tensor& fresh = key ? k : v;
      at::Tensor block = pool.index_select(0, meta.gather_rows).to(StreamType());  // [B * Kmax, H, dh]
      if (!plan.patch_rows.empty()) {
        const bool every_token = static_cast<int64_t>(plan.patch_tok.size()) == fresh.size(0) && g.uniform;
        block.index_copy_(0, meta.patch_rows, every_token ? fresh : fresh.index_select(0, meta.patch_tok));
      }
      (key ? Kp : Vp) = block.view({B, Kmax, H, dh});
    }
    if (plan.write_after_gather) WritePool(plan, meta, l, k, v);
  } else if (B == 1) {
    Kp = (g.m[0] > 0 ? at::cat({Held(*batch[0], l, true), k}, 0) : k.contiguous()).unsqueeze(0);
    Vp = (g.m[0] > 0 ? at::cat({Held(*batch[0], l, false), v}, 0) : v.contiguous()).unsqueeze(0);
  } else {
    Kp = at::zeros({B, Kmax, H, dh}, fopt);
    Vp = at::zeros({B, Kmax, H, dh}, fopt);
    int64_t offset = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = g.n[b], m = g.m[b];
      if (m > 0) {
        Kp[b].slice(0, 0, m).copy_(Held(*batch[b], l, true));
        Vp[b].slice(0, 0, m).copy_(Held(*batch[b], l, false));
      }
      Kp[b].slice(0, m, g.K[b]).copy_(k.slice(0, offset, offset + n));
      Vp[b].slice(0, m, g.K[b]).copy_(v.slice(0, offset, offset + n));
      offset += n;
    }
  }
  return {Kp, Vp};
}

void IncrementalModel::WritePool(const PoolPlan& plan, const PassMeta& meta, int64_t l, const at::Tensor& k,
                                 const at::Tensor& v) const {
  if (plan.write_rows.empty()) return;
  // A decode step writes every token's keys, in order: no gather of them first.
  bool every_token = static_cast<int64_t>(plan.write_tok.size()) == k.size(0);
  for (size_t i = 0; every_token && i < plan.write_tok.size(); ++i)
    every_token = plan.write_tok[i] == static_cast<int64_t>(i);
  for (const bool key : {true, false}) {
    at::Tensor& pool = key ? pool_->keys(l) : pool_->values(l);
    const at::Tensor& fresh = key ? k : v;
    pool.index_copy_(0, meta.write_rows,
                     (every_token ? fresh : fresh.index_select(0, meta.write_tok)).to(pool.scalar_type()));
  }
}

at::Tensor IncrementalModel::ReluProduct(const at::Tensor& x, int64_t l) const {
  const LayerWeights& L = weights_.layers[l];
  const at::Tensor& w = L.ff1_w;
  if (at::Tensor y = SkinnyProduct(x, w, L.ff1_b, true); y.defined()) return y;
  // One kernel on a GPU (cuBLASLt's bias and ReLU epilogue) instead of two;
  // on a CPU the same addmm and ReLU as below.
  if (generic_ && (w.scalar_type() == at::kFloat || bf16_stream_) && L.ff1_b.defined() && x.dim() == 2)
    return at::_addmm_activation(L.ff1_b, x.to(w.scalar_type()), w.t());
  return at::relu(Product(x, l, 2, L.ff1_b));
}

at::Tensor IncrementalModel::AddNorm(const at::Tensor& x, const at::Tensor& add, const at::Tensor& weight,
                                     const at::Tensor& bias, at::Tensor* narrow) const {
  if (narrow != nullptr) *narrow = at::Tensor();
  const auto f32 = at::kFloat;
  if (!add_norm_ || x.dim() != 2 || x.size(1) > kResidualNormMaxWidth || x.scalar_type() != f32 ||
      weight.scalar_type() != f32 || bias.scalar_type() != f32 ||
      !(add.scalar_type() == f32 || add.scalar_type() == at::kBFloat16) || add.sizes() != x.sizes())
    return LayerNorm(x + add, weight, bias);
  const at::Tensor xc = x.contiguous(), ac = add.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
  at::Tensor out = at::empty_like(xc);
  ResidualNormArgs a;
  a.rows = xc.size(0);
  a.width = xc.size(1);
  a.x = xc.data_ptr<float>();
  a.add = ac.data_ptr();
  a.add_bf16 = ac.scalar_type() == at::kBFloat16;
  a.weight = wc.data_ptr<float>();
  a.bias = bc.data_ptr<float>();
  a.eps = static_cast<float>(kLayerNormEps);
  a.out = out.data_ptr<float>();
  if (bf16_stream_ && narrow != nullptr) {
    *narrow = at::empty_like(xc, xc.options().dtype(at::kBFloat16));
    a.out_bf16 = narrow->data_ptr();
  }
  if (!cuda_kernels_) {
    at::parallel_for(0, a.rows, 8, [&](int64_t begin, int64_t end) { ResidualLayerNormCpu(a, begin, end); });
  } else {
    LaunchResidualLayerNorm(a, device_.index());
  }
  return out;
}

at::Tensor IncrementalModel::SkinnyProduct(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                                           bool relu) const {
  const at::ScalarType type = w.scalar_type();
  if (x.dim() != 2 || x.size(0) == 0 || x.size(0) > skinny_rows_ || w.dim() != 2 || x.size(1) != w.size(1) ||
      !(type == at::kFloat || (bf16_stream_ && type == at::kBFloat16)) ||
      (bias.defined() && (bias.dim() != 1 || bias.size(0) != w.size(0) ||
                          !(bias.scalar_type() == at::kFloat || bias.scalar_type() == at::kBFloat16))))
    return at::Tensor();
  const at::Tensor xc = x.to(type).contiguous(), wc = w.contiguous();
  const at::Tensor bc = bias.defined() ? bias.contiguous() : at::Tensor();
  at::Tensor y = at::empty({xc.size(0), wc.size(0)}, xc.options());
  SkinnyProductArgs a;
  a.rows = xc.size(0);
  a.cols = xc.size(1);
  a.outs = wc.size(0);
  a.x = xc.data_ptr();
  a.x_bf16 = a.w_bf16 = a.y_bf16 = type == at::kBFloat16;
  a.w = wc.data_ptr();
  if (bc.defined()) {
    a.bias = bc.data_ptr();
    a.bias_bf16 = bc.scalar_type() == at::kBFloat16;
  }
  a.relu = relu;
  a.y = y.data_ptr();
  if (!cuda_kernels_) {
    at::parallel_for(0, a.outs, 16, [&](int64_t begin, int64_t end) { SkinnyProductCpu(a, begin, end); });
  } else {
    LaunchSkinnyProduct(a, device_.index());
  }
  return y;
}

bool IncrementalModel::SplitDecodeRuns(const PassGeometry& g, const PoolPlan& plan) const {
  return split_decode_ && (device_.is_cpu() || device_.is_cuda()) && g.N == 1 && g.uniform && plan.gather &&
         plan.patch_rows.empty();
}

at::Tensor IncrementalModel::SplitDecode(const PassGeometry& g, const PassMeta& meta, int64_t l,
                                         const at::Tensor& qkv) const {
  const ModelConfig& c = config_;
  const int64_t B = g.B, H = c.n_head, dh = c.d_head;
  const auto fopt = at::TensorOptions().dtype(at::kFloat).device(device_);
  const at::Tensor q = qkv.contiguous();  // [B, 3, H, dh], float32 or bfloat16 (read as it is)
  const at::Tensor u = weights_.u(c, l).to(at::kFloat).contiguous(), v = weights_.v(c, l).to(at::kFloat).contiguous();
  const at::Tensor& keys = pool_->keys(l);
  const at::Tensor& values = pool_->values(l);
  const at::Tensor& rel = rel_k16_.empty() ? rel_k_[l] : rel_k16_[l];
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && rel.is_contiguous(),
              "SplitDecode reads the pool and the position table as contiguous rows");
  SplitDecodeArgs a;
  a.sessions = B;
  a.heads = H;
  a.dh = dh;
  a.keys = g.Kmax;
  a.q = q.data_ptr();
  a.q_stride = 3 * H * dh;
  a.q_bf16 = q.scalar_type() == at::kBFloat16;
  a.u = u.data_ptr<float>();
  a.v = v.data_ptr<float>();
  a.pool_keys = keys.data_ptr();
  a.pool_values = values.data_ptr();
  a.kv_bf16 = keys.scalar_type() == at::kBFloat16;
  a.rows = meta.gather_rows.data_ptr<int64_t>();
  // Every session writes its key (SplitDecodeRuns: no patched rows), and
  // the kernel stores it: no index_copy_ into the pool before it.
  TORCH_CHECK(meta.write_rows.numel() == B, "SplitDecode: ", meta.write_rows.numel(), " new keys' rows for ", B,
              " sessions");
  a.write_rows = meta.write_rows.data_ptr<int64_t>();
  a.skip_row = SlotPool::kDiscardRow;
  a.held = meta.held.data_ptr<int64_t>();
  a.window = meta.window.data_ptr<int64_t>();
  a.rel = rel.data_ptr();
  a.rel_bf16 = rel.scalar_type() == at::kBFloat16;
  a.rel_size = rel.size(0);
  a.scale = static_cast<float>(ScoreScale(dh));
  const at::Tensor partial = at::empty({B, H, a.Chunks(), dh + 2}, fopt);
  at::Tensor out = at::empty({B, H * dh}, fopt.dtype(StreamType()));
  a.partial = partial.data_ptr<float>();
  if (meta.split_done.defined()) a.done = meta.split_done[l].data_ptr<int>();
  a.out = out.data_ptr();
  a.out_stride = H * dh;
  a.out_bf16 = out.scalar_type() == at::kBFloat16;
  if (!cuda_kernels_) {
    at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) { SplitDecodeAttentionCpu(a, begin, end); });
  } else {
    LaunchSplitDecodeAttention(a, device_.index());
  }
  return out;
}

at::Tensor IncrementalModel::PassAttention(const PassGeometry& g, const PassMeta& meta, int64_t l,
                                           const at::Tensor& qkv, const at::Tensor& Kp, const at::Tensor& Vp,
                                           const at::TensorOptions& fopt) {
  const ModelConfig& c = config_;
  const int64_t B = g.B, N = g.N, H = c.n_head, dh = c.d_head;
  if (!generic_ && Bf16Attention() && isa_ == KernelIsa::kBest && PrefillAttentionRuns(dh))
    return FusedAttention(g, l, qkv, Kp, Vp, fopt);
  const at::Tensor q = qkv.select(1, 0);
  const at::Tensor Qp = g.uniform ? q.reshape({B, N, H, dh})
                                  : at::zeros({B * N, H, dh}, fopt).index_copy_(0, meta.row_idx, q).view({B, N, H, dh});
  // Converted once, read by every block's products.
  const at::Tensor qu = AttentionOperand((Qp + weights_.u(c, l)).permute({0, 2, 1, 3}));  // [B, H, N, dh]
  const at::Tensor Kq = AttentionOperand(Kp), Vq = AttentionOperand(Vp);
  const at::Tensor rel = rel_k_[l].slice(0, 0, g.D).permute({1, 2, 0});
  at::Tensor vec;
  if (sdpa_pass_) {
    // The scale folded into the small query operand, not applied to the [B, H, N, D] scores.
    const at::Tensor bd_scaled =
        AttentionProduct(((Qp + weights_.v(c, l)) * ScoreScale(dh)).permute({0, 2, 1, 3}), rel);  // [B,H,N,D]
    vec = SdpaAttention(meta, qu, Kq, Vq, bd_scaled);
  } else {
    const at::Tensor bd_all = AttentionProduct((Qp + weights_.v(c, l)).permute({0, 2, 1, 3}), rel);  // [B,H,N,D]
    vec = generic_ ? TensorOpAttention(meta, qu, Kq, Vq, bd_all) : BlockedAttention(g, qu, Kq, Vq, bd_all);
  }
  vec = vec.to(StreamType()).permute({0, 2, 1, 3}).reshape({B * N, H * dh});
  if (!g.uniform) vec = vec.index_select(0, meta.row_idx);
  return vec;
}

// bfloat16 on AMX, fused (prefill_attention.h): each session's keys and
// values as rows [K_b, H * dh], read in place.
at::Tensor IncrementalModel::FusedAttention(const PassGeometry& g, int64_t l, const at::Tensor& qkv,
                                            const at::Tensor& Kp, const at::Tensor& Vp, const at::TensorOptions& fopt) {
  const ModelConfig& c = config_;
  const int64_t T = g.T, H = c.n_head, dh = c.d_head;
  at::Tensor vec = at::empty({T, H * dh}, fopt);
  const at::Tensor qrows = qkv.view({T, 3 * H * dh});
  const at::Tensor rel = rel_k_[l].contiguous();
  const at::Tensor u = weights_.u(c, l).contiguous(), vb = weights_.v(c, l).contiguous();
  int64_t offset = 0;
  for (int64_t b = 0; b < g.B; ++b) {
    const int64_t K = g.K[b];
    const at::Tensor kb = Kp[b].slice(0, 0, K).contiguous(), vv = Vp[b].slice(0, 0, K).contiguous();
    PrefillAttentionArgs pa;
    pa.heads = H;
    pa.dh = dh;
    pa.n = g.n[b];
    pa.held = g.m[b];
    pa.window = g.M[b];
    pa.q = qrows.data_ptr<float>() + offset * 3 * H * dh;
    pa.q_stride = 3 * H * dh;
    pa.u = u.data_ptr<float>();
    pa.v = vb.data_ptr<float>();
    pa.keys = kb.data_ptr<float>();
    pa.values = vv.data_ptr<float>();
    pa.kv_stride = H * dh;
    pa.rel = rel.data_ptr<float>();
    pa.rel_size = std::min({rel.size(0), K, g.M[b]});  // the distances its windows span
    pa.scale = static_cast<float>(ScoreScale(dh));
    pa.out = vec.data_ptr<float>() + offset * H * dh;
    pa.out_stride = H * dh;
    PrefillAttention attention(pa, &prefill_buffers_);
    at::parallel_for(0, attention.pack_items(), 1, [&](int64_t begin, int64_t end) { attention.Pack(begin, end); });
    at::parallel_for(0, attention.units(), 1, [&](int64_t begin, int64_t end) { attention.Run(begin, end); });
    offset += g.n[b];
  }
  return vec;
}

// The CPU kernels' fused softmax (prefill_kernels.h), over blocks of queries
// when one session feeds many: a block sees only the keys of its queries'
// windows, not every key of the pass, so a long input's score blocks (and
// their products) shrink from N x (m + N) to about N x (M + block). float32
// products only: bfloat16 ones (oneDNN) lost more to the smaller products
// than the blocks saved (measured). Returns [B, H, N, dh].
at::Tensor IncrementalModel::BlockedAttention(const PassGeometry& g, const at::Tensor& qu, const at::Tensor& Kq,
                                              const at::Tensor& Vq, const at::Tensor& bd_all) const {
  const int64_t B = g.B, N = g.N, H = config_.n_head;
  const std::vector<int64_t>&m = g.m, &n = g.n, &M = g.M;
  const bool blocks = B == 1 && qu.scalar_type() == at::kFloat;
  const int64_t block = blocks ? kQueryBlock : N;
  std::vector<at::Tensor> parts;
  for (int64_t i0 = 0; i0 < N; i0 += block) {
    const int64_t i1 = std::min(N, i0 + block);
    const int64_t j0 = blocks ? std::max<int64_t>(0, m[0] + i0 - M[0] + 1) : 0;
    const int64_t j1 = blocks ? m[0] + i1 : g.Kmax;
    std::vector<int64_t> held_here = m, fed_here = n;
    if (blocks) {
      held_here[0] = m[0] + i0 - j0;
      fed_here[0] = i1 - i0;
    }
    const at::Tensor ac = AttentionProduct(qu.slice(2, i0, i1), Kq.slice(1, j0, j1).permute({0, 2, 3, 1})).contiguous();
    const at::Tensor bd = bd_all.slice(2, i0, i1).contiguous();
    at::Tensor prob = at::empty({B, H, i1 - i0, j1 - j0}, ac.options());
    ScoreSoftmaxArgs sm;
    sm.ac = ac.data_ptr();
    sm.bd = bd.data_ptr();
    sm.elem = ac.scalar_type() == at::kBFloat16 ? Elem::kBf16 : Elem::kF32;  // the softmax is float32 in every mode
    sm.heads = H;
    sm.N = i1 - i0;
    sm.K = j1 - j0;
    sm.D = g.D;
    sm.held = held_here.data();
    sm.fed = fed_here.data();
    sm.window = M.data();
    sm.scale = static_cast<float>(ScoreScale(config_.d_head));
    sm.prob = prob.data_ptr();
    sm.prob_elem = sm.elem;
    const KernelIsa isa = isa_;
    at::parallel_for(0, B * H * (i1 - i0), 16, [&](int64_t begin, int64_t end) { ScoreSoftmax(sm, begin, end, isa); });
    parts.push_back(AttentionProduct(prob, Vq.slice(1, j0, j1).permute({0, 2, 1, 3})));
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 2);
}

// The generic path's attention in tensor ops: scores, masked softmax, values.
// Returns [B, H, N, dh].
at::Tensor IncrementalModel::TensorOpAttention(const PassMeta& meta, const at::Tensor& qu, const at::Tensor& Kq,
                                               const at::Tensor& Vq, const at::Tensor& bd_all) const {
  const at::Tensor ac = AttentionProduct(qu, Kq.permute({0, 2, 3, 1}));
  at::Tensor score = ac.to(at::kFloat).add_(bd_all.gather(3, meta.gather_idx)).mul_(ScoreScale(config_.d_head));
  score.masked_fill_(meta.masked, -INFINITY);
  return AttentionProduct(at::softmax(score, -1), Vq.permute({0, 2, 1, 3}));
}

// The tensor ops' attention as one call: softmax(ac * scale + bias) V, with
// bias = bd * scale at each key's distance and -inf outside the window (the
// tensor ops' mask; padded query rows stay finite). On a GPU a fused kernel
// (memory-efficient or cuDNN attention, which take an additive mask) reads
// the bias once and never writes the scores or probabilities out. Returns
// [B, H, N, dh].
at::Tensor IncrementalModel::SdpaAttention(const PassMeta& meta, const at::Tensor& qu, const at::Tensor& Kq,
                                           const at::Tensor& Vq, const at::Tensor& bd_scaled) const {
#if TXL_TORCH_HAS_SDPA
  const at::ScalarType t = qu.scalar_type();  // the fused kernels take one type for all four
  at::Tensor bias = bd_scaled.gather(3, meta.gather_idx).to(t).masked_fill_(meta.masked, -INFINITY);
  return at::scaled_dot_product_attention(qu, Kq.permute({0, 2, 1, 3}).to(t), Vq.permute({0, 2, 1, 3}).to(t), bias,
                                          /*dropout_p=*/0.0, /*is_causal=*/false, ScoreScale(config_.d_head));
#else
  (void)meta, (void)qu, (void)Kq, (void)Vq, (void)bd_scaled;
  TORCH_CHECK(false, "sdpa_pass_attention needs libtorch 2.1 or later");
#endif
}

bool TorchHasSdpa() { return TXL_TORCH_HAS_SDPA; }

// The window needs mem_len - 1 earlier keys; keep exactly those.
void IncrementalModel::KeepWindow(const PassGeometry& g, int64_t l, const at::Tensor& Kp, const at::Tensor& Vp,
                                  std::vector<std::vector<at::Tensor>>& new_k,
                                  std::vector<std::vector<at::Tensor>>& new_v) {
  for (int64_t b = 0; b < g.B; ++b) {
    const int64_t K = g.K[b], keep = std::min(g.M[b] - 1, K);
    if (keep > 0 && !g.in_place[b]) {
      new_k[b][l] = Kp[b].slice(0, K - keep, K).clone();
      new_v[b][l] = Vp[b].slice(0, K - keep, K).clone();
    }
  }
}

at::Tensor IncrementalModel::Pass(std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens) {
  const PassGeometry g = Geometry(batch, tokens);
  const int64_t B = g.B;
  EnsureRelTable(g.D);
  const PoolPlan plan = PlanPool(batch, g);
  const PassMeta meta = UploadMeta(g, plan);
  // New layer memories; installed in the pending states after the last layer
  // (Held reads the old ones until then).
  std::vector<std::vector<at::Tensor>> new_k(B, std::vector<at::Tensor>(config_.n_layer)),
      new_v(B, std::vector<at::Tensor>(config_.n_layer));
  at::Tensor x = Layers(batch, g, plan, meta, new_k, new_v);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t keep = std::max<int64_t>(0, std::min(g.M[b] - 1, g.K[b]));
    batch[b]->length = keep;
    batch[b]->k = std::move(new_k[b]);
    batch[b]->v = std::move(new_v[b]);
  }
  return x;
}

at::Tensor IncrementalModel::Layers(const std::vector<Pending*>& batch, const PassGeometry& g, const PoolPlan& plan,
                                    const PassMeta& meta, std::vector<std::vector<at::Tensor>>& new_k,
                                    std::vector<std::vector<at::Tensor>>& new_v) {
  const ModelConfig& c = config_;
  const int64_t H = c.n_head, dh = c.d_head, T = g.T;
  const bool kv16 = kv_dtype_ == KvDtype::kBfloat16;
  const bool split = SplitDecodeRuns(g, plan);        // every session in place: nothing for KeepWindow
  at::Tensor x = Embed(c, weights_, meta.tokens);     // [T, d]
  const auto fopt = x.options().dtype(StreamType());  // the attention's keys and values
  // x rounded to bfloat16 by the norm that made it (AddNorm), where
  // activations are bfloat16: the products take it as it is, unconverted.
  // Undefined otherwise (the embedding, pre-norm layers, the unfused norm).
  at::Tensor x16;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = weights_.layers[l];
    at::Tensor h = c.pre_lnorm ? LayerNorm(x, L.attn_ln_w, L.attn_ln_b) : x;
    at::Tensor qkv = Product(x16.defined() ? x16 : h, l, 0, at::Tensor()).view({T, 3, H, dh});
    at::Tensor k = qkv.select(1, 1), v = qkv.select(1, 2);
    // Attend exactly what the memory will hold (SplitDecode stores the new
    // keys in the pool, then reads them from there; bfloat16 activations
    // hold it already).
    if (kv16 && !split && !bf16_stream_) {
      k = k.to(at::kBFloat16).to(at::kFloat);
      v = v.to(at::kBFloat16).to(at::kFloat);
    }
    at::Tensor vec;  // [T, H * dh], in token order
    if (split) {
      vec = SplitDecode(g, meta, l, qkv);  // writes the pool too
    } else {
      if (!plan.gather) WriteInPlace(batch, g, l, k, v);
      const auto [Kp, Vp] = GatherKeys(batch, g, plan, meta, l, k, v, fopt);
      vec = PassAttention(g, meta, l, qkv, Kp, Vp, fopt);
      KeepWindow(g, l, Kp, Vp, new_k, new_v);
    }
    at::Tensor out = Product(vec, l, 1, at::Tensor());
    x = c.pre_lnorm ? x + out : AddNorm(x, out, L.attn_ln_w, L.attn_ln_b, &x16);
    // FeedForward (txl_math.h) with this precision's products (for float32,
    // Product is the same at::linear).
    auto core = [&](const at::Tensor& in) { return Product(ReluProduct(in, l), l, 3, L.ff2_b); };
    x = c.pre_lnorm ? x + core(LayerNorm(x, L.ff_ln_w, L.ff_ln_b))
                    : AddNorm(x, core(x16.defined() ? x16 : x), L.ff_ln_w, L.ff_ln_b,
                              l + 1 < c.n_layer ? &x16 : nullptr);  // the readout takes float32
  }
  return x;
}

}  // namespace txl
