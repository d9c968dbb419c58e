#include "model/net/incremental.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "model/kernels/decode_kernels.h"
#include "model/kernels/decode_step.h"
#include "model/kernels/prefill_kernels.h"
#include "model/net/txl_math.h"

namespace txl {

namespace {

// Queries per block of a long one-session prefill (Pass): small enough that a
// block's score rows span little more than the window, large enough for
// efficient products.
constexpr int64_t kQueryBlock = 128;

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

// `values` on `device` in one copy: on a GPU from pinned host memory and
// without waiting for it (the caching host allocator keeps the buffer until
// the copy is done).
at::Tensor Upload(const std::vector<int64_t>& values, const at::Device& device) {
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  const int64_t count = static_cast<int64_t>(values.size());
  if (device.is_cpu()) return at::tensor(values, lopt);
  at::Tensor host = at::empty({count}, lopt.pinned_memory(true));
  if (count > 0) std::memcpy(host.data_ptr<int64_t>(), values.data(), count * sizeof(int64_t));
  return host.to(device, /*non_blocking=*/true);
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

IncrementalModel::IncrementalModel(ModelConfig config, TxlWeights weights, at::Device device, Precision precision)
    : config_(std::move(config)),
      weights_(weights.To(device)),
      device_(device),
      dtype_(precision.dtype),
      kv_dtype_(precision.kv_dtype),
      isa_(precision.isa),
      generic_(!device.is_cpu() || precision.kernels == Kernels::kGeneric),
      bf16_products_(precision.bf16_products && (device.is_cuda() || CpuHasBf16Products())) {
  PrepareWeights();
}

void IncrementalModel::EnsureRelTable(int64_t distances) {
  if (distances <= rel_size_) return;
  // Grow geometrically so that sessions with rising mem_len rebuild rarely.
  const int64_t size = std::max({distances, 2 * rel_size_, config_.mem_len});
  at::Tensor pos = PositionEmbedding(weights_, ClampedDistances(config_, size, at::TensorOptions().device(device_)));
  rel_k_.clear();
  rel_kt_.clear();
  // With reduced weights the decode step reads the table in bfloat16 (it is
  // a product of weights); the prefill reads the same rounded values.
  const bool narrow = dtype_ != WeightDtype::kFloat32;
  for (const LayerWeights& L : weights_.layers) {
    at::Tensor table = at::linear(pos, L.r_w).view({size, config_.n_head, config_.d_head});
    if (narrow) table = table.to(at::kBFloat16).to(at::kFloat);
    rel_k_.push_back(table);
    // The head-major copy only where the decode kernels read it (not on a
    // GPU, where it would take device memory for nothing).
    if (!decode_.empty())
      rel_kt_.push_back(table.permute({1, 0, 2}).contiguous().to(narrow ? at::kBFloat16 : at::kFloat));
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
  if (pool_) {  // more rows; the held ones stay where they are (Step adopted the memory)
    const std::vector<int64_t> more = pool_->Take(cap - m->capacity_);
    m->pool_ = pool_;
    m->slots_.insert(m->slots_.end(), more.begin(), more.end());
    m->capacity_ = cap;
    return;
  }
  const auto opts = at::TensorOptions().dtype(kv_type()).device(device_);
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
    // Slots not written yet are zeros, not whatever the heap held: images
    // (ExportSession) copy every slot, and must not carry server memory.
    k[l].slice(1, m->capacity_, cap).zero_();
    v[l].slice(1, m->capacity_, cap).zero_();
  }
  m->k_.swap(k);
  m->v_.swap(v);
  m->capacity_ = cap;
}

void IncrementalModel::ReserveSessionMemory(int64_t bytes) {
  if (!pool_ || bytes <= 0) return;
  const int64_t per_row = 2 * config_.n_layer * pool_->row_bytes();  // a row: keys and values of every layer
  pool_->Reserve(1 + bytes / per_row);
}

void IncrementalModel::Adopt(SessionMemory* m) const {
  if (!pool_ || m->pool_ == pool_) return;
  if (m->capacity_ == 0) {
    m->pool_ = pool_;
    return;
  }
  std::vector<int64_t> slots = pool_->Take(m->capacity_);
  try {
    const at::Tensor rows = at::tensor(slots, at::TensorOptions().dtype(at::kLong)).to(device_);
    for (int64_t l = 0; l < static_cast<int64_t>(m->k_.size()); ++l) {
      // A ring [H, capacity, dh] is slot-major in the pool: [capacity, H, dh].
      pool_->keys(l).index_copy_(0, rows, m->k_[l].permute({1, 0, 2}).to(pool_->keys(l).scalar_type()));
      pool_->values(l).index_copy_(0, rows, m->v_[l].permute({1, 0, 2}).to(pool_->values(l).scalar_type()));
    }
  } catch (...) {
    pool_->Give(slots);
    throw;
  }
  for (size_t l = 0; l < m->k_.size(); ++l) {
    m->k_[l] = at::Tensor();
    m->v_[l] = at::Tensor();
  }
  m->pool_ = pool_;
  m->slots_ = std::move(slots);
}

std::vector<int64_t> IncrementalModel::PoolRows(const SessionMemory& m, int64_t first, int64_t n) const {
  std::vector<int64_t> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = m.slots_[(first + i) % m.mem_len_];
  return rows;
}

at::Tensor IncrementalModel::HeldRows(const SessionMemory& m, int64_t l, bool key, int64_t first, int64_t n) const {
  if (!m.pool_) return RingRows(key ? m.k_[l] : m.v_[l], m.mem_len_, first, n);
  const at::Tensor rows = at::tensor(PoolRows(m, first, n), at::TensorOptions().dtype(at::kLong)).to(device_);
  return (key ? m.pool_->keys(l) : m.pool_->values(l)).index_select(0, rows);
}

void IncrementalModel::WriteRows(SessionMemory& m, int64_t l, bool key, int64_t first, const at::Tensor& rows) const {
  if (!m.pool_) {
    RingWrite(key ? m.k_[l] : m.v_[l], m.mem_len_, first, rows);
    return;
  }
  at::Tensor& pool = key ? m.pool_->keys(l) : m.pool_->values(l);
  const at::Tensor at_rows =
      at::tensor(PoolRows(m, first, rows.size(0)), at::TensorOptions().dtype(at::kLong)).to(device_);
  pool.index_copy_(0, at_rows, rows.to(pool.scalar_type()));
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
    if (n > 0 && pool_) Adopt(m);
    if (n > 0 && m->mem_len_ > 1) Reserve(m, std::min(m->mem_len_, m->position_ + n));
    pending.push_back(
        {m, m->length_, m->position_, std::vector<at::Tensor>(m->k_.size()), std::vector<at::Tensor>(m->v_.size())});
    max_n = std::max(max_n, n);
  }
  const bool can_decode = !decode_.empty();
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
        WriteRows(*mem, static_cast<int64_t>(l), true, p.position - p.length, p.k[l]);
        WriteRows(*mem, static_cast<int64_t>(l), false, p.position - p.length, p.v[l]);
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
  at::Tensor x = Embed(c, weights_, at::tensor(flat, at::TensorOptions().dtype(at::kLong))).contiguous();  // [B, d]

  // Every layer in one parallel region (decode_step.h). One session's
  // products read the weights as stored (the fastest one-row read measured,
  // docs/PERFORMANCE.md); several sessions' read the packed weights, streamed
  // once and reused from cache for every session (at::linear would have the
  // BLAS pack the whole matrix on every call). For bfloat16 weights this
  // also beat oneDNN's AMX products at 16, 32 and 64 sessions (step 13
  // there): a step's products are small, and each opened its own regions.
  std::vector<DecodeStepLayer> layers(c.n_layer);
  std::vector<DecodeSession> rings(c.n_layer * B);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = weights_.layers[l];
    const DecodeLayer& P = decode_[l];
    for (int64_t b = 0; b < B; ++b) {
      SessionMemory* m = batch[b]->memory;
      const bool ring = m->mem_len_ > 1;
      rings[l * B + b] = {ring ? m->k_[l].data_ptr() : nullptr,
                          ring ? m->v_[l].data_ptr() : nullptr,
                          m->capacity_,
                          m->mem_len_,
                          batch[b]->position,
                          batch[b]->length};
    }
    DecodeStepLayer& S = layers[l];
    S.qkv = P.m[0].Rows();
    S.o = P.m[1].Rows();
    S.ff1 = P.m[2].Rows();
    S.ff2 = P.m[3].Rows();
    S.ff1_b = L.ff1_b.data_ptr<float>();
    S.ff2_b = L.ff2_b.data_ptr<float>();
    S.attn_ln_w = L.attn_ln_w.data_ptr<float>();
    S.attn_ln_b = L.attn_ln_b.data_ptr<float>();
    S.ff_ln_w = L.ff_ln_w.data_ptr<float>();
    S.ff_ln_b = L.ff_ln_b.data_ptr<float>();
    S.u = P.u.data_ptr<float>();
    S.v = P.v.data_ptr<float>();
    S.rel = rel_kt_[l].data_ptr();
    S.sessions = &rings[l * B];
    if (B > 1) {
      for (int which = 0; which < 4; ++which) S.packed[which] = P.m[which].Packed();
    }
  }
  DecodeStepArgs step;
  step.layers = layers.data();
  step.n_layer = c.n_layer;
  step.d_model = c.d_model;
  step.d_inner = c.d_inner;
  step.pre_lnorm = c.pre_lnorm;
  DecodeAttentionArgs& args = step.attention;
  args.H = H;
  args.dh = dh;
  args.width = width;
  args.rel_size = rel_size_;
  args.kv = kv_dtype_ == KvDtype::kBfloat16 ? Elem::kBf16 : Elem::kF32;
  args.rel_elem = dtype_ == WeightDtype::kFloat32 ? Elem::kF32 : Elem::kBf16;
  args.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)));
  step.parts = std::min<int64_t>({at::get_num_threads(), H, c.d_inner});
  step.batch = B;
  step.x = x.data_ptr<float>();
  at::Tensor scratch = at::empty({DecodeStepScratch(step)}, x.options());
  step.scratch = scratch.data_ptr<float>();
  std::vector<std::atomic<int64_t>> claimed(c.n_layer);  // value-initialised: zero
  step.claimed = claimed.data();
  TeamBarrier barrier(step.parts);
  at::parallel_for(0, step.parts, 1, [&](int64_t begin, int64_t end) {
    if (B == 1) {
      DecodeStepLayers(step, begin, end, barrier, isa_);
    } else {
      DecodeBatchLayers(step, begin, end, barrier, isa_);
    }
  });
  for (int64_t b = 0; b < B; ++b) {
    batch[b]->length = std::min(batch[b]->memory->mem_len_ - 1, batch[b]->length + 1);
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
  const bool kv16 = kv_dtype_ == KvDtype::kBfloat16;
  EnsureRelTable(D);

  // The held positions of session b in layer l, in order, [m_b, H, dh].
  auto held = [&](int64_t b, int64_t l, bool key) -> at::Tensor {
    const Pending* p = batch[b];
    if (p->replaced()) return key ? p->k[l] : p->v[l];
    return HeldRows(*p->memory, l, key, p->position - p->length, p->length).to(at::kFloat);
  };

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
  // The generic path with every memory in the pool (all but the later passes
  // of an input longer than kPassTokens): per layer, the new keys go into
  // their pool rows with one indexed copy, every session's keys come out as
  // [B, Kmax] with one indexed gather (padding reads the pool's zero row), and
  // new keys that cannot go into the pool yet (the window would drop a held
  // one, or there is no memory) are laid over the gathered block with a
  // third. Without the pool each session's keys are copied one by one.
  const bool gather =
      pool_ != nullptr && std::none_of(batch.begin(), batch.end(), [](const Pending* p) { return p->replaced(); });
  std::vector<int64_t> gather_rows, write_rows, write_tok, patch_rows, patch_tok;
  if (gather) {
    gather_rows.assign(B * Kmax, SlotPool::kPadRow);
    int64_t offset = 0;
    for (int64_t b = 0; b < B; ++b) {
      const Pending* p = batch[b];
      const bool pooled = in_place[b] && M[b] > 1;
      const std::vector<int64_t> old_rows = PoolRows(*p->memory, p->position - m[b], m[b]);
      std::copy(old_rows.begin(), old_rows.end(), gather_rows.begin() + b * Kmax);
      const std::vector<int64_t> new_rows = pooled ? PoolRows(*p->memory, p->position, n[b]) : std::vector<int64_t>();
      for (int64_t i = 0; i < n[b]; ++i) {
        if (pooled) {
          gather_rows[b * Kmax + m[b] + i] = new_rows[i];
          write_rows.push_back(new_rows[i]);
          write_tok.push_back(offset + i);
        } else {
          patch_rows.push_back(b * Kmax + m[b] + i);
          patch_tok.push_back(offset + i);
        }
      }
      offset += n[b];
    }
  }

  // The step's metadata (tokens, padded row indices, and for the tensor-op
  // softmax the sessions' lengths) goes to the device in one copy.
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  std::vector<int64_t> meta = flat;
  std::vector<const std::vector<int64_t>*> parts = {&rows};
  if (generic_) parts.insert(parts.end(), {&n, &m, &M});
  if (gather) parts.insert(parts.end(), {&gather_rows, &write_rows, &write_tok, &patch_rows, &patch_tok});
  for (const std::vector<int64_t>* part : parts) meta.insert(meta.end(), part->begin(), part->end());
  const at::Tensor on_device = Upload(meta, device_);
  int64_t meta_at = 0;
  auto next = [&](int64_t len) {
    at::Tensor t = on_device.slice(0, meta_at, meta_at + len);
    meta_at += len;
    return t;
  };
  at::Tensor x = Embed(c, weights_, next(T));                          // [T, d]
  const at::Tensor row_idx = next(static_cast<int64_t>(rows.size()));  // empty when uniform
  const auto fopt = x.options();

  // Geometry of the padded [B, N queries, Kmax keys] score block: key j of
  // session b is at distance m_b + i - j from its query i. The tensor-op
  // softmax needs it as a mask and position indices; the CPU's fused kernel
  // (prefill_kernels.h) derives both from m, n and M itself.
  at::Tensor masked, gather_idx;
  if (generic_) {
    at::Tensor nt = next(B).view({B, 1, 1}), mt = next(B).view({B, 1, 1});
    at::Tensor Mt = next(B).view({B, 1, 1});
    at::Tensor qi = at::arange(N, lopt.device(device_)).view({1, N, 1});
    at::Tensor kj = at::arange(Kmax, lopt.device(device_)).view({1, 1, Kmax});
    at::Tensor dist = mt + qi - kj;
    // Padded query rows stay unmasked so their softmax is finite; they are dropped.
    masked = (((kj >= mt + nt) | (dist < 0) | (dist >= Mt)) & (qi < nt)).unsqueeze(1);  // [B, 1, N, Kmax]
    gather_idx = dist.clamp(0, D - 1).unsqueeze(1).expand({B, H, N, Kmax});
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));

  at::Tensor gather_idx_rows, write_idx, write_src, patch_idx, patch_src;
  if (gather) {
    gather_idx_rows = next(B * Kmax);
    write_idx = next(static_cast<int64_t>(write_rows.size()));
    write_src = next(static_cast<int64_t>(write_tok.size()));
    patch_idx = next(static_cast<int64_t>(patch_rows.size()));
    patch_src = next(static_cast<int64_t>(patch_tok.size()));
  }
  // New layer memories; installed in the pending states after the last layer
  // (held() reads the old ones until then).
  std::vector<std::vector<at::Tensor>> new_k(B, std::vector<at::Tensor>(c.n_layer)),
      new_v(B, std::vector<at::Tensor>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = weights_.layers[l];
    at::Tensor h = c.pre_lnorm ? LayerNorm(x, L.attn_ln_w, L.attn_ln_b) : x;
    at::Tensor qkv = Product(h, l, 0, at::Tensor()).view({T, 3, H, dh});
    at::Tensor q = qkv.select(1, 0), k = qkv.select(1, 1), v = qkv.select(1, 2);
    if (kv16) {  // attend exactly what the memory will hold (as the decode kernel does)
      k = k.to(at::kBFloat16).to(at::kFloat);
      v = v.to(at::kBFloat16).to(at::kFloat);
    }
    if (!gather) {
      int64_t offset = 0;
      for (int64_t b = 0; b < B; ++b) {
        if (in_place[b] && M[b] > 1) {
          WriteRows(*batch[b]->memory, l, true, batch[b]->position, k.slice(0, offset, offset + n[b]));
          WriteRows(*batch[b]->memory, l, false, batch[b]->position, v.slice(0, offset, offset + n[b]));
        }
        offset += n[b];
      }
    }

    at::Tensor Qp = uniform ? q.reshape({B, N, H, dh})
                            : at::zeros({B * N, H, dh}, fopt).index_copy_(0, row_idx, q).view({B, N, H, dh});
    at::Tensor Kp, Vp;
    if (gather) {
      for (const bool key : {true, false}) {
        at::Tensor& pool = key ? pool_->keys(l) : pool_->values(l);
        const at::Tensor& fresh = key ? k : v;
        if (!write_rows.empty())
          pool.index_copy_(0, write_idx, fresh.index_select(0, write_src).to(pool.scalar_type()));
        at::Tensor block = pool.index_select(0, gather_idx_rows).to(at::kFloat);  // [B * Kmax, H, dh]
        if (!patch_rows.empty()) block.index_copy_(0, patch_idx, fresh.index_select(0, patch_src));
        (key ? Kp : Vp) = block.view({B, Kmax, H, dh});
      }
    } else if (B == 1) {
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

    at::Tensor vec;  // [T, H * dh]: every session's attention output, in token order
    if (!generic_ && Bf16Attention() && isa_ == KernelIsa::kBest && PrefillAttentionRuns(dh)) {
      // bfloat16 on AMX, fused (prefill_attention.h): each session's keys
      // and values as rows [K_b, H * dh], read in place.
      vec = at::empty({T, H * dh}, fopt);
      const at::Tensor qrows = qkv.view({T, 3 * H * dh});
      const at::Tensor rel = rel_k_[l].contiguous();
      const at::Tensor u = weights_.u(c, l).contiguous(), vb = weights_.v(c, l).contiguous();
      int64_t offset = 0;
      for (int64_t b = 0; b < B; ++b) {
        const at::Tensor kb = Kp[b].slice(0, 0, K[b]).contiguous(), vv = Vp[b].slice(0, 0, K[b]).contiguous();
        PrefillAttentionArgs pa;
        pa.heads = H;
        pa.dh = dh;
        pa.n = n[b];
        pa.held = m[b];
        pa.window = M[b];
        pa.q = qrows.data_ptr<float>() + offset * 3 * H * dh;
        pa.q_stride = 3 * H * dh;
        pa.u = u.data_ptr<float>();
        pa.v = vb.data_ptr<float>();
        pa.keys = kb.data_ptr<float>();
        pa.values = vv.data_ptr<float>();
        pa.kv_stride = H * dh;
        pa.rel = rel.data_ptr<float>();
        pa.rel_size = std::min({rel.size(0), K[b], M[b]});  // the distances its windows span
        pa.scale = static_cast<float>(scale);
        pa.out = vec.data_ptr<float>() + offset * H * dh;
        pa.out_stride = H * dh;
        PrefillAttention attention(pa, &prefill_buffers_);
        at::parallel_for(0, attention.pack_items(), 1, [&](int64_t begin, int64_t end) { attention.Pack(begin, end); });
        at::parallel_for(0, attention.units(), 1, [&](int64_t begin, int64_t end) { attention.Run(begin, end); });
        offset += n[b];
      }
    } else {
      // Converted once, read by every block's products.
      const at::Tensor qu = AttentionOperand((Qp + weights_.u(c, l)).permute({0, 2, 1, 3}));  // [B, H, N, dh]
      const at::Tensor Kq = AttentionOperand(Kp), Vq = AttentionOperand(Vp);
      const at::Tensor bd_all = AttentionProduct((Qp + weights_.v(c, l)).permute({0, 2, 1, 3}),
                                                 rel_k_[l].slice(0, 0, D).permute({1, 2, 0}));  // [B,H,N,D]
      if (!generic_) {
        // Fused softmax (prefill_kernels.h), over blocks of queries when one
        // session feeds many: a block sees only the keys of its queries'
        // windows, not every key of the pass, so a long input's score blocks
        // (and their products) shrink from N x (m + N) to about N x (M + block).
        // float32 products only: bfloat16 ones (oneDNN) lost more to the
        // smaller products than the blocks saved (measured).
        const bool blocks = B == 1 && qu.scalar_type() == at::kFloat;
        const int64_t block = blocks ? kQueryBlock : N;
        std::vector<at::Tensor> parts;
        for (int64_t i0 = 0; i0 < N; i0 += block) {
          const int64_t i1 = std::min(N, i0 + block);
          const int64_t j0 = blocks ? std::max<int64_t>(0, m[0] + i0 - M[0] + 1) : 0;
          const int64_t j1 = blocks ? m[0] + i1 : Kmax;
          std::vector<int64_t> held_here = m, fed_here = n;
          if (blocks) {
            held_here[0] = m[0] + i0 - j0;
            fed_here[0] = i1 - i0;
          }
          const at::Tensor ac =
              AttentionProduct(qu.slice(2, i0, i1), Kq.slice(1, j0, j1).permute({0, 2, 3, 1})).contiguous();
          const at::Tensor bd = bd_all.slice(2, i0, i1).contiguous();
          at::Tensor prob = at::empty({B, H, i1 - i0, j1 - j0}, ac.options());
          ScoreSoftmaxArgs sm;
          sm.ac = ac.data_ptr();
          sm.bd = bd.data_ptr();
          sm.elem =
              ac.scalar_type() == at::kBFloat16 ? Elem::kBf16 : Elem::kF32;  // the softmax is float32 in every mode
          sm.heads = H;
          sm.N = i1 - i0;
          sm.K = j1 - j0;
          sm.D = D;
          sm.held = held_here.data();
          sm.fed = fed_here.data();
          sm.window = M.data();
          sm.scale = static_cast<float>(scale);
          sm.prob = prob.data_ptr();
          sm.prob_elem = sm.elem;
          const KernelIsa isa = isa_;
          at::parallel_for(0, B * H * (i1 - i0), 16,
                           [&](int64_t begin, int64_t end) { ScoreSoftmax(sm, begin, end, isa); });
          parts.push_back(AttentionProduct(prob, Vq.slice(1, j0, j1).permute({0, 2, 1, 3})));
        }
        vec = parts.size() == 1 ? parts[0] : at::cat(parts, 2);
      } else {
        const at::Tensor ac = AttentionProduct(qu, Kq.permute({0, 2, 3, 1}));
        at::Tensor score = ac.to(at::kFloat).add_(bd_all.gather(3, gather_idx)).mul_(scale);
        score.masked_fill_(masked, -INFINITY);
        vec = AttentionProduct(at::softmax(score, -1), Vq.permute({0, 2, 1, 3}));
      }
      vec = vec.to(at::kFloat).permute({0, 2, 1, 3}).reshape({B * N, H * dh});
      if (!uniform) vec = vec.index_select(0, row_idx);
    }
    at::Tensor out = Product(vec, l, 1, at::Tensor());
    x = c.pre_lnorm ? x + out : LayerNorm(x + out, L.attn_ln_w, L.attn_ln_b);
    // FeedForward (txl_math.h) with this precision's products (for float32,
    // Product is the same at::linear).
    auto core = [&](const at::Tensor& in) { return Product(at::relu(Product(in, l, 2, L.ff1_b)), l, 3, L.ff2_b); };
    x = c.pre_lnorm ? x + core(LayerNorm(x, L.ff_ln_w, L.ff_ln_b)) : LayerNorm(x + core(x), L.ff_ln_w, L.ff_ln_b);

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
