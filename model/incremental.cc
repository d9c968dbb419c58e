#include "model/incremental.h"

#include <ATen/Parallel.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "model/decode_kernels.h"
#include "model/txl_math.h"

namespace txl {

int64_t SessionMemory::bytes() const {
  if (k_.empty() || !k_[0].defined()) return 0;
  const at::Tensor& t = k_[0];  // [H, capacity, dh]: what is allocated, not just what is held
  return 2 * static_cast<int64_t>(k_.size()) * capacity_ * t.size(0) * t.size(2) * t.element_size();
}

absl::StatusOr<std::unique_ptr<SessionState>> SessionMemory::Clone() const {
  try {
    return std::unique_ptr<SessionState>(new SessionMemory(Copy()));
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("copying a session's memory failed: ", e.what_without_backtrace()));
  }
}

absl::Status SessionMemory::AppendTo(std::string* out) const {
  try {
    WriteImage(out);
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("copying a session's memory out failed: ", e.what_without_backtrace()));
  }
}

SessionMemory SessionMemory::Copy() const {
  SessionMemory copy(static_cast<int64_t>(k_.size()), mem_len_, full_bytes_);
  copy.position_ = position_;
  copy.length_ = length_;
  copy.capacity_ = capacity_;
  if (k_.empty() || !k_[0].defined()) return copy;
  const int64_t n = static_cast<int64_t>(k_.size());
  std::vector<at::Tensor> rings = NewRings(2 * n, k_[0].sizes().vec(), k_[0].options());
  for (int64_t l = 0; l < n; ++l) {
    copy.k_[l] = rings[2 * l].copy_(k_[l]);
    copy.v_[l] = rings[2 * l + 1].copy_(v_[l]);
  }
  return copy;
}

namespace {

// Positions [first, first + n) of a ring [H, capacity, dh] whose slots are
// p % mem_len, in order, as [n, H, dh] (a view unless they wrap).
at::Tensor RingRows(const at::Tensor& ring, int64_t mem_len, int64_t first, int64_t n) {
  const int64_t s = first % mem_len, cap = ring.size(1);
  if (s + n <= cap) return ring.slice(1, s, s + n).permute({1, 0, 2});
  return at::cat({ring.slice(1, s, cap), ring.slice(1, 0, s + n - cap)}, 1).permute({1, 0, 2});
}

// Writes rows [n, H, dh] as positions [first, first + n) of a ring.
void RingWrite(at::Tensor& ring, int64_t mem_len, int64_t first, const at::Tensor& rows) {
  const int64_t n = rows.size(0), s = first % mem_len, cap = ring.size(1);
  const int64_t a = std::min(n, cap - s);
  ring.slice(1, s, s + a).copy_(rows.slice(0, 0, a).permute({1, 0, 2}));
  if (a < n) ring.slice(1, 0, n - a).copy_(rows.slice(0, a, n).permute({1, 0, 2}));
}

}  // namespace

// A session's memory as it evolves during one step; committed at the end.
// k[l] / v[l] are undefined until a pass replaces the memory (then
// [length, H, dh], the held positions in order); until then the memory is
// read from the session's ring.
struct IncrementalModel::Pending {
  SessionMemory* memory;
  int64_t length;
  int64_t position;
  std::vector<at::Tensor> k, v;
  bool replaced() const { return !k.empty() && k[0].defined(); }
};

namespace {

// Float tensors of these shapes, uninitialised, in one arena of transparent
// huge pages: a decode step streams its weights, tables and memories, and
// with 4 KiB pages it paid a TLB miss every 4 KiB (measured: 3-5% of a
// one-session step). Falls back to ordinary tensors if the arena fails.
constexpr int64_t kHugePage = int64_t{2} << 20, kArenaAlign = 64;

int64_t ArenaBytes(const std::vector<int64_t>& shape) {
  int64_t n = 4;
  for (int64_t d : shape) n *= d;
  return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

std::vector<at::Tensor> HugePageTensors(const std::vector<std::vector<int64_t>>& shapes) {
  int64_t total = 0;
  for (const auto& shape : shapes) total += ArenaBytes(shape);
  total = std::max(kHugePage, (total + kHugePage - 1) / kHugePage * kHugePage);
  std::vector<at::Tensor> out;
  void* raw = std::aligned_alloc(kHugePage, total);
  if (raw == nullptr) {
    for (const auto& shape : shapes) out.push_back(at::empty(shape, at::kFloat));
    return out;
  }
  madvise(raw, total, MADV_HUGEPAGE);
  auto arena = std::shared_ptr<void>(raw, [](void* p) { std::free(p); });
  char* at = static_cast<char*>(raw);
  for (const auto& shape : shapes) {
    out.push_back(at::from_blob(
        at, shape, [arena](void*) {}, at::TensorOptions().dtype(at::kFloat)));
    at += ArenaBytes(shape);
  }
  return out;
}

// Moves the tensors (float) into one huge-page arena (HugePageTensors).
void InHugePages(const std::vector<at::Tensor*>& tensors) {
  std::vector<std::vector<int64_t>> shapes;
  for (const at::Tensor* t : tensors) shapes.push_back(t->sizes().vec());
  std::vector<at::Tensor> moved = HugePageTensors(shapes);
  for (size_t i = 0; i < tensors.size(); ++i) {
    moved[i].copy_(*tensors[i]);
    *tensors[i] = moved[i];
  }
}

}  // namespace

std::vector<at::Tensor> NewRings(int64_t count, const std::vector<int64_t>& shape, const at::TensorOptions& options) {
  const int64_t bytes = count * ArenaBytes(shape);
  const int64_t spare = (kHugePage - bytes % kHugePage) % kHugePage;
  if (options.device().is_cpu() && options.dtype() == at::kFloat && spare * 50 <= bytes) {
    return HugePageTensors(std::vector<std::vector<int64_t>>(count, shape));
  }
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(at::empty(shape, options));
  return out;
}

IncrementalModel::IncrementalModel(ModelConfig config, TxlWeights weights, at::Device device, WeightDtype dtype,
                                   KvDtype kv_dtype)
    : config_(std::move(config)), weights_(weights.To(device)), device_(device), dtype_(dtype), kv_dtype_(kv_dtype) {
  if (device_.is_cpu() && weights_.layers[0].qkv_w.scalar_type() == at::kFloat) {
    std::vector<at::Tensor*> streamed;
    std::vector<const at::Tensor*> to_pack;
    std::vector<std::vector<int64_t>> packed_shapes;
    for (LayerWeights& L : weights_.layers) {
      for (at::Tensor* t : {&L.qkv_w, &L.o_w, &L.ff1_w, &L.ff1_b, &L.ff2_w, &L.ff2_b}) streamed.push_back(t);
      for (const at::Tensor* w : {&L.qkv_w, &L.o_w, &L.ff1_w, &L.ff2_w}) {
        to_pack.push_back(w);
        packed_shapes.push_back({PackedSize(w->size(0), w->size(1))});
      }
    }
    InHugePages(streamed);  // contiguous from here on: the kernels read them as arrays
    std::vector<at::Tensor> packed = HugePageTensors(packed_shapes);
    for (size_t i = 0; i < packed.size(); ++i) {
      const at::Tensor& w = *to_pack[i];
      PackPanels(w.data_ptr<float>(), w.size(0), w.size(1), packed[i].data_ptr<float>());
    }
    for (int64_t l = 0; l < config_.n_layer; ++l) {
      decode_.push_back({packed[4 * l], packed[4 * l + 1], packed[4 * l + 2], packed[4 * l + 3],
                         weights_.u(config_, l).contiguous(), weights_.v(config_, l).contiguous()});
    }
  }
}

std::string IncrementalModel::KernelPath() const {
  return absl::StrCat(device_.str(), ": ", DtypeName(dtype_), " weights, ", DtypeName(kv_dtype_), " memories");
}

void IncrementalModel::EnsureRelTable(int64_t distances) {
  if (distances <= rel_size_) return;
  // Grow geometrically so that sessions with rising mem_len rebuild rarely.
  const int64_t size = std::max({distances, 2 * rel_size_, config_.mem_len});
  at::Tensor pos = PositionEmbedding(weights_, ClampedDistances(config_, size, at::TensorOptions().device(device_)));
  rel_k_.clear();
  rel_kt_.clear();
  for (const LayerWeights& L : weights_.layers) {
    rel_k_.push_back(at::linear(pos, L.r_w).view({size, config_.n_head, config_.d_head}));
    rel_kt_.push_back(rel_k_.back().permute({1, 0, 2}).contiguous());
  }
  if (!decode_.empty()) {  // the CPU decode path streams these
    std::vector<at::Tensor*> tables;
    for (at::Tensor& t : rel_kt_) tables.push_back(&t);
    InHugePages(tables);
  }
  rel_size_ = size;
}

// Grows a session's rings to hold `needed` slots (at most mem_len), keeping
// their contents. Growth jumps to mem_len once past half of it, so a session
// filled by a prefill is allocated once.
void IncrementalModel::Reserve(SessionMemory* m, int64_t needed) const {
  if (needed <= m->capacity_) return;
  const int64_t M = m->mem_len_;
  int64_t cap = std::max(needed, std::min(M, 2 * m->capacity_));
  if (2 * cap > M) cap = M;
  const auto opts = weights_.layers[0].qkv_w.options();
  const int64_t n = static_cast<int64_t>(m->k_.size());
  std::vector<at::Tensor> rings = NewRings(2 * n, {config_.n_head, cap, config_.d_head}, opts);
  std::vector<at::Tensor> k(n), v(n);
  for (int64_t l = 0; l < n; ++l) {
    k[l] = rings[2 * l];
    v[l] = rings[2 * l + 1];
    if (m->capacity_ > 0) {  // not wrapped yet: slot == position
      k[l].slice(1, 0, m->capacity_).copy_(m->k_[l]);
      v[l].slice(1, 0, m->capacity_).copy_(m->v_[l]);
    }
  }
  m->k_.swap(k);
  m->v_.swap(v);
  m->capacity_ = cap;
}

at::Tensor IncrementalModel::Step(absl::Span<const StepInput> inputs) {
  // Sessions come from this model (LanguageModel::NewSession, RestoreSession, Clone).
  std::vector<SessionMemory*> memories;
  memories.reserve(inputs.size());
  for (const StepInput& in : inputs) memories.push_back(static_cast<SessionMemory*>(in.session));
  std::vector<Pending> pending;
  pending.reserve(inputs.size());
  int64_t max_n = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    SessionMemory* m = memories[i];
    const int64_t n = static_cast<int64_t>(inputs[i].tokens.size());
    // Room for every position the step will hold (contents kept: invisible).
    if (n > 0 && m->mem_len_ > 1) Reserve(m, std::min(m->mem_len_, m->position_ + n));
    pending.push_back(
        {m, m->length_, m->position_, std::vector<at::Tensor>(m->k_.size()), std::vector<at::Tensor>(m->v_.size())});
    max_n = std::max(max_n, n);
  }
  const bool can_decode = device_.is_cpu() && weights_.layers[0].qkv_w.scalar_type() == at::kFloat;
  std::vector<std::vector<at::Tensor>> parts(inputs.size());
  for (int64_t start = 0; start < max_n; start += kPassTokens) {
    std::vector<Pending*> batch;
    std::vector<std::vector<int64_t>> tokens;
    std::vector<size_t> which;
    bool decode = can_decode;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& t = inputs[i].tokens;
      const int64_t n = static_cast<int64_t>(t.size());
      if (start >= n) continue;
      batch.push_back(&pending[i]);
      tokens.emplace_back(t.begin() + start, t.begin() + std::min(n, start + kPassTokens));
      which.push_back(i);
      decode = decode && tokens.back().size() == 1 && !pending[i].replaced();
    }
    at::Tensor hidden = decode ? DecodePass(batch, tokens) : Pass(batch, tokens);
    int64_t offset = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      const int64_t n = static_cast<int64_t>(tokens[b].size());
      parts[which[b]].push_back(hidden.slice(0, offset, offset + n));
      offset += n;
      batch[b]->position += n;
    }
  }
  // Commit: nothing above touched the positions the sessions hold.
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    SessionMemory* mem = memories[i];
    Pending& p = pending[i];
    if (p.replaced()) {
      for (size_t l = 0; l < p.k.size(); ++l) {
        RingWrite(mem->k_[l], mem->mem_len_, p.position - p.length, p.k[l]);
        RingWrite(mem->v_[l], mem->mem_len_, p.position - p.length, p.v[l]);
      }
    }
    mem->length_ = p.length;
    mem->position_ = p.position;
    for (at::Tensor& t : parts[i]) all.push_back(std::move(t));
  }
  if (all.empty()) return at::empty({0, config_.d_model}, at::TensorOptions().device(device_));
  return all.size() == 1 ? all[0] : at::cat(all, 0);
}

at::Tensor IncrementalModel::DecodePass(std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens) {
  const ModelConfig& c = config_;
  const int64_t B = static_cast<int64_t>(batch.size()), H = c.n_head, dh = c.d_head;
  std::vector<int64_t> flat(B);
  int64_t width = 1;
  for (int64_t b = 0; b < B; ++b) {
    flat[b] = tokens[b][0];
    width = std::max(width, batch[b]->length + 1);
  }
  EnsureRelTable(width);
  at::Tensor x = Embed(c, weights_, at::tensor(flat, at::TensorOptions().dtype(at::kLong)));  // [B, d]
  const auto fopt = x.options();
  at::Tensor vec = at::empty({B, H * dh}, fopt);
  std::vector<DecodeSession> sessions(B);
  DecodeAttentionArgs args;
  args.sessions = sessions.data();
  args.batch = B;
  args.H = H;
  args.dh = dh;
  args.width = width;
  args.rel_size = rel_size_;
  args.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)));
  args.out = vec.data_ptr<float>();
  // Several sessions' projections: the packed weights, streamed once and
  // reused from cache for every session (at::linear would have the BLAS pack
  // the whole matrix again on every call), split over the threads by panels.
  // (One session's run inside the fused regions below, on the weights as
  // stored: the fastest one-row read measured, docs/PERFORMANCE.md.)
  auto Linear = [B](const at::Tensor& in, const at::Tensor& w, const at::Tensor& packed, const at::Tensor& bias,
                    bool relu = false) {
    const int64_t rows = w.size(0), cols = w.size(1);
    at::Tensor y = at::empty({B, rows}, in.options());
    const at::Tensor xc = in.contiguous();
    const float* xp = xc.data_ptr<float>();
    const float* pp = packed.data_ptr<float>();
    const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, (rows + kPanel - 1) / kPanel, 1, [&](int64_t begin, int64_t end) {
      PackedProduct(pp, rows, cols, xp, B, bp, relu, yp, begin, end);
    });
    return y;
  };
  const int64_t grain = std::max<int64_t>(1, (B * H) / (4 * at::get_num_threads()));
  // One session: work split into one part per thread (heads; inner units).
  const int64_t threads = at::get_num_threads();
  const int64_t head_parts = std::min(H, threads), inner_parts = std::min(c.d_inner, threads);
  at::Tensor qkv1, inner1, shares1, oshares1;
  if (B == 1) {
    qkv1 = at::empty({1, 3 * H * dh}, fopt);
    inner1 = at::empty({c.d_inner}, fopt);
    shares1 = at::empty({inner_parts, c.d_model}, fopt);
    oshares1 = at::empty({head_parts, c.d_model}, fopt);
  }
  // [1, d] = the sum of the parts' shares [parts, d] (+ bias).
  auto SumShares = [&](const at::Tensor& shares, const float* bias) {
    const int64_t parts = shares.size(0), D = shares.size(1);
    const float* sp = shares.data_ptr<float>();
    at::Tensor y = at::empty({1, D}, fopt);
    float* yp = y.data_ptr<float>();
    for (int64_t i = 0; i < D; ++i) {
      float sum = bias ? bias[i] : 0.0f;
      for (int64_t p = 0; p < parts; ++p) sum += sp[p * D + i];
      yp[i] = sum;
    }
    return y;
  };

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = weights_.layers[l];
    const DecodeLayer& P = decode_[l];
    for (int64_t b = 0; b < B; ++b) {
      SessionMemory* m = batch[b]->memory;
      const bool ring = m->mem_len_ > 1;
      sessions[b] = {ring ? m->k_[l].data_ptr<float>() : nullptr,
                     ring ? m->v_[l].data_ptr<float>() : nullptr,
                     m->capacity_,
                     m->mem_len_,
                     batch[b]->position,
                     batch[b]->length};
    }
    at::Tensor h = (c.pre_lnorm ? LayerNorm(x, L.attn_ln_w, L.attn_ln_b) : x).contiguous();
    args.u = P.u.data_ptr<float>();
    args.v = P.v.data_ptr<float>();
    args.rel = rel_kt_[l].data_ptr<float>();
    at::Tensor out;
    if (B == 1) {
      // Each part projects the query, key and value rows of its own heads,
      // attends with them, and computes their share of the output
      // projection (its columns for those heads): one parallel region.
      const float* w = L.qkv_w.data_ptr<float>();
      const float* in = h.data_ptr<float>();
      const float* wo = L.o_w.data_ptr<float>();
      const float* attended = vec.data_ptr<float>();
      const int64_t D = c.d_model, HD = H * dh;
      float* shares = oshares1.data_ptr<float>();
      args.qkv = qkv1.data_ptr<float>();
      float* y = qkv1.data_ptr<float>();
      at::parallel_for(0, head_parts, 1, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const int64_t h0 = p * H / head_parts, h1 = (p + 1) * H / head_parts;
          for (int64_t which = 0; which < 3; ++which) {
            GemvRows(w, D, in, nullptr, false, y, D, (which * H + h0) * dh, (which * H + h1) * dh);
          }
          DecodeAttention(args, h0, h1);
          GemvRows(wo + h0 * dh, HD, attended + h0 * dh, nullptr, false, shares + p * D, (h1 - h0) * dh, 0, D);
        }
      });
      out = SumShares(oshares1, nullptr);
    } else {
      at::Tensor qkv = Linear(h, L.qkv_w, P.qkv, at::Tensor()).contiguous();  // [B, 3H dh]
      args.qkv = qkv.data_ptr<float>();
      at::parallel_for(0, B * H, grain, [&](int64_t begin, int64_t end) { DecodeAttention(args, begin, end); });
      out = Linear(vec, L.o_w, P.o, at::Tensor());
    }
    x = c.pre_lnorm ? x + out : LayerNorm(x + out, L.attn_ln_w, L.attn_ln_b);
    // FeedForward (txl_math.h), with the same Linear; one session: each part
    // computes its block of the inner layer and that block's share of the
    // output (one parallel region), and the shares are summed.
    auto core = [&](const at::Tensor& in_t) {
      if (B != 1) return Linear(Linear(in_t, L.ff1_w, P.ff1, L.ff1_b, /*relu=*/true), L.ff2_w, P.ff2, L.ff2_b);
      const at::Tensor in_c = in_t.contiguous();
      const float* in = in_c.data_ptr<float>();
      float* inner = inner1.data_ptr<float>();
      float* shares = shares1.data_ptr<float>();
      const int64_t D = c.d_model, I = c.d_inner;
      at::parallel_for(0, inner_parts, 1, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const int64_t a = p * I / inner_parts, e = (p + 1) * I / inner_parts;
          GemvRows(L.ff1_w.data_ptr<float>(), D, in, L.ff1_b.data_ptr<float>(), true, inner, D, a, e);
          GemvRows(L.ff2_w.data_ptr<float>() + a, I, inner + a, nullptr, false, shares + p * D, e - a, 0, D);
        }
      });
      return SumShares(shares1, L.ff2_b.data_ptr<float>());
    };
    x = c.pre_lnorm ? x + core(LayerNorm(x, L.ff_ln_w, L.ff_ln_b)) : LayerNorm(x + core(x), L.ff_ln_w, L.ff_ln_b);
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t M = batch[b]->memory->mem_len_;
    batch[b]->length = std::min(M - 1, batch[b]->length + 1);
  }
  return x;
}

at::Tensor IncrementalModel::Pass(std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens) {
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

  // The held positions of session b in layer l, in order, [m_b, H, dh].
  auto held = [&](int64_t b, int64_t l, bool key) -> at::Tensor {
    const Pending* p = batch[b];
    if (p->replaced()) return key ? p->k[l] : p->v[l];
    const SessionMemory* s = p->memory;
    return RingRows(key ? s->k_[l] : s->v_[l], s->mem_len_, p->position - p->length, p->length);
  };

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
  masked = masked.unsqueeze(1);  // [B, 1, N, Kmax]
  at::Tensor gather_idx = dist.clamp(0, D - 1).unsqueeze(1).expand({B, H, N, Kmax});
  at::Tensor row_idx = uniform ? at::Tensor() : to_dev(rows);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));

  // Where the new keys/values fit in free ring slots (the span from the
  // oldest committed position to the newest new one is at most mem_len), they
  // are written in place, never over a committed position; otherwise the
  // pass builds the new held memory aside and the commit installs it.
  std::vector<char> in_place(B);
  for (int64_t b = 0; b < B; ++b) {
    const Pending* p = batch[b];
    const SessionMemory* s = p->memory;
    in_place[b] = !p->replaced() && (p->position + n[b]) - (s->position_ - s->length_) <= M[b];
  }
  // New layer memories; installed in the pending states after the last layer
  // (held() reads the old ones until then).
  std::vector<std::vector<at::Tensor>> new_k(B, std::vector<at::Tensor>(c.n_layer)),
      new_v(B, std::vector<at::Tensor>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = weights_.layers[l];
    at::Tensor h = c.pre_lnorm ? LayerNorm(x, L.attn_ln_w, L.attn_ln_b) : x;
    at::Tensor qkv = at::linear(h, L.qkv_w).view({T, 3, H, dh});
    at::Tensor q = qkv.select(1, 0), k = qkv.select(1, 1), v = qkv.select(1, 2);
    {
      int64_t offset = 0;
      for (int64_t b = 0; b < B; ++b) {
        if (in_place[b] && M[b] > 1) {
          SessionMemory* s = batch[b]->memory;
          RingWrite(s->k_[l], M[b], batch[b]->position, k.slice(0, offset, offset + n[b]));
          RingWrite(s->v_[l], M[b], batch[b]->position, v.slice(0, offset, offset + n[b]));
        }
        offset += n[b];
      }
    }

    at::Tensor Qp = uniform ? q.reshape({B, N, H, dh})
                            : at::zeros({B * N, H, dh}, fopt).index_copy_(0, row_idx, q).view({B, N, H, dh});
    at::Tensor Kp, Vp;
    if (B == 1) {
      Kp = (m[0] > 0 ? at::cat({held(0, l, true), k}, 0) : k.contiguous()).unsqueeze(0);
      Vp = (m[0] > 0 ? at::cat({held(0, l, false), v}, 0) : v.contiguous()).unsqueeze(0);
    } else {
      Kp = at::zeros({B, Kmax, H, dh}, fopt);
      Vp = at::zeros({B, Kmax, H, dh}, fopt);
      int64_t offset = 0;
      for (int64_t b = 0; b < B; ++b) {
        if (m[b] > 0) {
          Kp[b].slice(0, 0, m[b]).copy_(held(b, l, true));
          Vp[b].slice(0, 0, m[b]).copy_(held(b, l, false));
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
      if (keep > 0 && !in_place[b]) {
        new_k[b][l] = Kp[b].slice(0, K[b] - keep, K[b]).clone();
        new_v[b][l] = Vp[b].slice(0, K[b] - keep, K[b]).clone();
      }
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t keep = std::max<int64_t>(0, std::min(M[b] - 1, K[b]));
    batch[b]->length = keep;
    batch[b]->k = std::move(new_k[b]);
    batch[b]->v = std::move(new_v[b]);
  }
  return x;
}

}  // namespace txl
