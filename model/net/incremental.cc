#include "model/net/incremental.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "model/kernels/decode_kernels.h"
#include "model/kernels/decode_step.h"
#include "model/net/cuda_launch.h"
#include "model/net/incremental_pass.h"
#include "model/net/txl_math.h"

namespace txl {

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

IncrementalModel::IncrementalModel(ModelConfig config, TxlWeights weights, at::Device device, Precision precision)
    : config_(std::move(config)),
      weights_(weights.To(device)),
      device_(device),
      dtype_(precision.dtype),
      kv_dtype_(precision.kv_dtype),
      isa_(precision.isa),
      generic_(!device.is_cpu() || precision.kernels == Kernels::kGeneric),
      bf16_products_(precision.bf16_products && (device.is_cuda() || CpuHasBf16Products())),
      bf16_stream_(precision.bf16_activations && generic_ && bf16_products_ &&
                   precision.dtype == WeightDtype::kBfloat16),
      sdpa_pass_(precision.sdpa_pass_attention && generic_ && TorchHasSdpa()),
      add_norm_(precision.fused_add_norm && generic_ && !config_.pre_lnorm),
      skinny_rows_(generic_ ? precision.skinny_max_rows : 0),
      cuda_kernels_(device.is_cuda() || (precision.emulate_cuda_kernels && generic_)),
      decode_graphs_(precision.decode_graphs && generic_),
      pass_graphs_(decode_graphs_ && precision.pass_graphs),
      split_decode_(precision.split_decode_attention && generic_),
      short_feeds_(precision.decode_short_feeds) {
  TORCH_CHECK(precision.skinny_max_rows >= 0 && precision.skinny_max_rows <= kSkinnyMaxRows,
              "skinny_max_rows: must be 0 to ", kSkinnyMaxRows, ", got ", precision.skinny_max_rows);
  TORCH_CHECK(!precision.emulate_cuda_kernels || (device.is_cpu() && !CudaLaunchesQueueOnADevice()),
              "emulate_cuda_kernels: a test's switch for a CPU model in a build without CUDA, whose launches run "
              "on the block emulator (tests/model/cuda/emulated_device_test.cc)");
  PrepareWeights();
}

void IncrementalModel::EnsureRelTable(int64_t distances) {
  if (distances <= rel_size_) return;
  // Grow geometrically so that sessions with rising mem_len rebuild rarely.
  const int64_t size = std::max({distances, 2 * rel_size_, config_.mem_len});
  at::Tensor pos = PositionEmbedding(weights_, ClampedDistances(config_, size, at::TensorOptions().device(device_)));
  rel_k_.clear();
  rel_kt_.clear();
  rel_k16_.clear();
  // With reduced weights the decode step reads the table in bfloat16 (it is
  // a product of weights); the prefill reads the same rounded values.
  const bool narrow = dtype_ != WeightDtype::kFloat32;
  for (const LayerWeights& L : weights_.layers) {
    at::Tensor table = at::linear(pos, L.r_w).view({size, config_.n_head, config_.d_head});
    if (narrow) table = table.to(at::kBFloat16).to(at::kFloat);
    rel_k_.push_back(table);
    if (narrow && split_decode_) rel_k16_.push_back(table.to(at::kBFloat16));
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
void IncrementalModel::Reserve(SessionMemory* m, int64_t needed, SlotPool::Admitted use) const {
  if (needed <= m->capacity_) return;
  const int64_t M = m->mem_len_;
  int64_t cap = std::max(needed, std::min(M, 2 * m->capacity_));
  if (2 * cap > M) cap = M;
  if (pool_) {  // more rows; the held ones stay where they are (Step adopted the memory)
    const std::vector<int64_t> more = pool_->Take(cap - m->capacity_, use);
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
  pool_->Reserve(SlotPool::kReservedRows + bytes / per_row);
}

void IncrementalModel::JoinSharedPool(SharedSlotPools& pools) {
  if (!pool_) return;
  SharedSlotPools::Shape shape;
  shape.n_layer = config_.n_layer;
  shape.heads = pool_->heads();
  shape.d_head = pool_->d_head();
  shape.dtype = static_cast<int>(kv_type());
  shape.device = device_.str();
  std::shared_ptr<SlotPool> joined = pools.Join(shape, pool_);
  if (joined == pool_) return;
  // Captures hold the old pool's addresses (it is freed with its last holder).
  pool_ = std::move(joined);
  graphs_.clear();
  graphs_pool_ = nullptr;
}

void IncrementalModel::Adopt(SessionMemory* m, SlotPool::Admitted use) const {
  if (!pool_ || m->pool_ == pool_) return;
  if (m->capacity_ == 0) {
    m->pool_ = pool_;
    return;
  }
  std::vector<int64_t> slots = pool_->Take(m->capacity_, use);
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
  PoolRows(m, first, n, rows.data());
  return rows;
}

void IncrementalModel::PoolRows(const SessionMemory& m, int64_t first, int64_t n, int64_t* out) const {
  TORCH_CHECK(first >= 0 && n >= 0, "pool rows of positions [", first, ", ", first + n, ")");
  int64_t slot = first % m.mem_len_;
  while (n > 0) {
    const int64_t run = std::min(n, m.mem_len_ - slot);
    TORCH_CHECK(slot + run <= static_cast<int64_t>(m.slots_.size()), "pool rows past the session's ", m.slots_.size(),
                " slots: [", slot, ", ", slot + run, ")");
    std::copy_n(m.slots_.begin() + slot, run, out);
    out += run;
    n -= run;
    slot = 0;
  }
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

IncrementalModel::RingBackup IncrementalModel::BackUpOverwritten(absl::Span<const StepInput> inputs,
                                                                 const std::vector<size_t>& few) const {
  RingBackup backup;
  std::vector<int64_t> pool_rows;
  // A session's passes write positions [p, p + n) (p = position), position q
  // into the slot of q - M; of those, the committed ones are [p - length, p).
  auto overwritten = [&](size_t i, const std::function<void(int64_t)>& each) {
    const auto* m = static_cast<const SessionMemory*>(inputs[i].session);
    const int64_t n = static_cast<int64_t>(inputs[i].tokens.size()), M = m->mem_len_;
    if (n == 0 || M <= 1) return;
    const int64_t first = m->position_ - m->length_, end = std::min(m->position_, m->position_ + n - M);
    for (int64_t c = first; c < end; ++c) each(c % M);
  };
  if (pool_ != nullptr) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto* m = static_cast<SessionMemory*>(inputs[i].session);
      if (m->pool_ != pool_ || m->slots_.empty()) continue;
      const size_t before = pool_rows.size();
      overwritten(i, [&](int64_t slot) { pool_rows.push_back(m->slots_[slot]); });
      if (pool_rows.size() > before) backup.pooled.push_back(m);
    }
    if (!pool_rows.empty()) {
      backup.pool = pool_.get();
      backup.pool_rows = Upload(pool_rows, device_);
      for (int64_t l = 0; l < config_.n_layer; ++l) {
        backup.pk.push_back(pool_->keys(l).index_select(0, backup.pool_rows));
        backup.pv.push_back(pool_->values(l).index_select(0, backup.pool_rows));
      }
    }
    return backup;
  }
  for (size_t i : few) {
    auto* m = static_cast<SessionMemory*>(inputs[i].session);
    if (m->pool_ != nullptr || m->k_.empty() || !m->k_[0].defined()) continue;
    std::vector<int64_t> slots;
    overwritten(i, [&](int64_t slot) { slots.push_back(slot); });
    if (slots.empty()) continue;
    RingBackup::Saved saved{m, at::tensor(slots, at::TensorOptions().dtype(at::kLong)), {}, {}};
    for (size_t l = 0; l < m->k_.size(); ++l) {
      saved.k.push_back(m->k_[l].index_select(1, saved.slots));
      saved.v.push_back(m->v_[l].index_select(1, saved.slots));
    }
    backup.saved.push_back(std::move(saved));
  }
  return backup;
}

void IncrementalModel::RingBackup::Restore() {
  for (size_t l = 0; l < pk.size(); ++l) {
    pool->keys(static_cast<int64_t>(l)).index_copy_(0, pool_rows, pk[l]);
    pool->values(static_cast<int64_t>(l)).index_copy_(0, pool_rows, pv[l]);
  }
  for (Saved& s : saved) {
    for (size_t l = 0; l < s.k.size(); ++l) {
      s.memory->k_[l].index_copy_(1, s.slots, s.k[l]);
      s.memory->v_[l].index_copy_(1, s.slots, s.v[l]);
    }
  }
}

bool IncrementalModel::RingBackup::Holds(const SessionMemory* memory) const {
  return std::find(pooled.begin(), pooled.end(), memory) != pooled.end() ||
         std::any_of(saved.begin(), saved.end(), [memory](const Saved& s) { return s.memory == memory; });
}

at::Tensor IncrementalModel::Step(absl::Span<const StepInput> inputs) {
  at::Tensor out;
  const absl::Status stepped = Step(inputs, [&out](const at::Tensor& hidden) {
    out = hidden;
    return absl::OkStatus();
  });
  (void)stepped;  // the readout above cannot fail
  return out;
}

absl::Status IncrementalModel::Step(absl::Span<const StepInput> inputs, const Readout& readout) {
  // Sessions come from this model (LanguageModel::NewSession, RestoreSession, Clone).
  std::vector<SessionMemory*> memories;
  memories.reserve(inputs.size());
  for (const StepInput& in : inputs) memories.push_back(static_cast<SessionMemory*>(in.session));
  std::vector<Pending> pending;
  pending.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    SessionMemory* m = memories[i];
    const int64_t n = static_cast<int64_t>(inputs[i].tokens.size());
    // Room for every position the step will hold (contents kept: invisible).
    const SlotPool::Admitted use = inputs[i].uncounted ? SlotPool::Admitted::kNo : SlotPool::Admitted::kYes;
    if (n > 0 && pool_) Adopt(m, use);
    if (n > 0 && m->mem_len_ > 1) Reserve(m, std::min(m->mem_len_, m->position_ + n), use);
    pending.push_back(
        {m, m->length_, m->position_, std::vector<at::Tensor>(m->k_.size()), std::vector<at::Tensor>(m->v_.size())});
  }
  // A session feeding a few tokens (a turn's start: its pending token and a
  // short input) feeds them one token a pass, beside the decoders, instead
  // of taking the whole step through Pass: docs/MODEL.md, "Mixed steps". On
  // the CPU kernels those passes are DecodePass; on the generic path, with
  // decode graphs only, padded graph passes (eager, a token a pass
  // dispatches more ops than one Pass of the step).
  const bool can_decode = !decode_.empty();
  const bool split = short_feeds_ && (can_decode || (pool_ != nullptr && decode_graphs_));
  std::vector<size_t> few, many;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const size_t n = inputs[i].tokens.size();
    if (n == 0) continue;
    (split && n <= static_cast<size_t>(kDecodeFeedTokens) ? few : many).push_back(i);
  }
  // On the generic path a pass with a window of one cannot be padded: its
  // token passes would all be eager Passes, more than the step's one.
  if (!can_decode && std::any_of(few.begin(), few.end(), [&](size_t i) { return memories[i]->mem_len_ <= 1; })) {
    many.insert(many.end(), few.begin(), few.end());
    std::sort(many.begin(), many.end());  // in input order, as the readout reads them
    few.clear();
  }
  // Each pass's hidden states, and which inputs' tokens (in input order) and
  // how many of each are its rows.
  struct PassRows {
    at::Tensor hidden;
    std::vector<size_t> which;
    std::vector<int64_t> n;
  };
  std::vector<PassRows> pass_rows;
  // A later pass of a session writes into the slot of a position it still
  // holds until the commit: kept, and put back if the step throws.
  RingBackup backup = BackUpOverwritten(inputs, few);
  const auto passes = [&](const std::vector<size_t>& rows, int64_t chunk) {
    int64_t most = 0;
    for (size_t i : rows) most = std::max(most, static_cast<int64_t>(inputs[i].tokens.size()));
    for (int64_t start = 0; start < most; start += chunk) {
      std::vector<Pending*> batch;
      std::vector<std::vector<int64_t>> tokens;
      std::vector<size_t> which;
      bool decode = can_decode;
      for (size_t i : rows) {
        const auto& t = inputs[i].tokens;
        const int64_t n = static_cast<int64_t>(t.size());
        if (start >= n) continue;
        batch.push_back(&pending[i]);
        tokens.emplace_back(t.begin() + start, t.begin() + std::min(n, start + chunk));
        which.push_back(i);
        decode = decode && tokens.back().size() == 1 && !pending[i].replaced();
      }
      at::Tensor hidden = decode                                     ? DecodePass(batch, tokens)
                          : GraphEligible(batch, tokens, backup)     ? GraphDecodePass(batch, tokens)
                          : PassGraphEligible(batch, tokens, backup) ? GraphPass(batch, tokens)
                                                                     : Pass(batch, tokens);
      PassRows rows_of{hidden, which, {}};
      for (size_t b = 0; b < batch.size(); ++b) {
        const int64_t n = static_cast<int64_t>(tokens[b].size());
        rows_of.n.push_back(n);
        batch[b]->position += n;
      }
      pass_rows.push_back(std::move(rows_of));
    }
  };
  try {
    passes(few, 1);
    passes(many, kPassTokens);  // without short feeds: every session, as one step
    // The caller's readout, before anything commits: every session's rows in
    // input order. A step of one pass (the usual) has them so already, and
    // is read without slicing it per session (ops for every session).
    at::Tensor hidden;
    if (pass_rows.empty()) {
      hidden = at::empty({0, config_.d_model}, at::TensorOptions().device(device_));
    } else if (pass_rows.size() == 1 && std::is_sorted(pass_rows[0].which.begin(), pass_rows[0].which.end())) {
      hidden = pass_rows[0].hidden;
    } else {
      std::vector<std::vector<at::Tensor>> parts(inputs.size());
      for (const PassRows& r : pass_rows) {
        int64_t offset = 0;
        for (size_t b = 0; b < r.which.size(); ++b) {
          parts[r.which[b]].push_back(r.hidden.slice(0, offset, offset + r.n[b]));
          offset += r.n[b];
        }
      }
      std::vector<at::Tensor> all;
      for (std::vector<at::Tensor>& p : parts) {
        for (at::Tensor& t : p) all.push_back(std::move(t));
      }
      hidden = at::cat(all, 0);
    }
    if (absl::Status read = readout(hidden); !read.ok()) {
      backup.Restore();
      return read;
    }
    // Commit the memories a pass built aside. A write that throws leaves the
    // short feeds' windows restored (a replaced window written before it
    // stays written: its session's positions are not advanced).
    for (size_t i = 0; i < inputs.size(); ++i) {
      Pending& p = pending[i];
      if (!p.replaced()) continue;
      for (size_t l = 0; l < p.k.size(); ++l) {
        WriteRows(*memories[i], static_cast<int64_t>(l), true, p.position - p.length, p.k[l]);
        WriteRows(*memories[i], static_cast<int64_t>(l), false, p.position - p.length, p.v[l]);
      }
    }
  } catch (...) {
    backup.Restore();
    throw;
  }
  // The positions the sessions held are as they were, but for the slots
  // BackUpOverwritten kept (already rewritten, as the commit wants).
  for (size_t i = 0; i < inputs.size(); ++i) {
    memories[i]->length_ = pending[i].length;
    memories[i]->position_ = pending[i].position;
  }
  return absl::OkStatus();
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
  // products read bfloat16 and int8 weights row-major (the fastest one-row
  // read measured, docs/OPTIMISATIONS.md) and float32 ones from the panels
  // (as fast, and the only copy); several sessions' read the packed weights, streamed
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
    S.qkv = P.m[0].Gemv();
    S.o = P.m[1].Gemv();
    S.ff1 = P.m[2].Gemv();
    S.ff2 = P.m[3].Gemv();
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

}  // namespace txl
