#include "model/incremental.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/txl_math.h"

namespace txl {

int64_t SessionMemory::bytes() const {
  if (k_.empty() || !k_[0].defined()) return 0;
  const at::Tensor& t = k_[0];  // [H, capacity, dh]: what is allocated, not just what is held
  return 2 * static_cast<int64_t>(k_.size()) * capacity_ * t.size(0) * t.size(2) * t.element_size();
}

SessionMemory SessionMemory::Clone() const {
  SessionMemory copy(static_cast<int64_t>(k_.size()), mem_len_);
  copy.position_ = position_;
  copy.length_ = length_;
  copy.capacity_ = capacity_;
  for (size_t l = 0; l < k_.size(); ++l) {
    if (k_[l].defined()) copy.k_[l] = k_[l].clone();
    if (v_[l].defined()) copy.v_[l] = v_[l].clone();
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

// ---- The decode kernel: one query per (session, head), keys read in place.
// Written with GCC vector extensions; compiled twice (AVX2+FMA and the
// baseline ISA) and picked at run time.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float V8 __attribute__((vector_size(32)));

__attribute__((always_inline)) inline V8 Load8(const float* p) {
  V8 r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

__attribute__((always_inline)) inline float Sum8(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// y += alpha x over n floats.
__attribute__((always_inline)) inline void Axpy(float alpha, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  const V8 a = {alpha, alpha, alpha, alpha, alpha, alpha, alpha, alpha};
  for (; i + 8 <= n; i += 8) {
    V8 r = Load8(y + i) + a * Load8(x + i);
    std::memcpy(y + i, &r, sizeof(r));
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}

struct DecodeSession {
  float* k;  // ring [H, cap, dh] of this layer (null when mem_len == 1)
  float* v;
  int64_t cap, mem_len;
  int64_t position;  // of the new token
  int64_t length;    // positions held (all attended)
};

struct DecodeArgs {
  const DecodeSession* sessions;
  int64_t batch, H, dh;
  int64_t width;     // the most keys of any session (length + 1): row buffer size
  const float* qu;   // [B, H, dh]: query + u
  const float* qv;   // [B, H, dh]: query + v
  const float* qkv;  // [B, 3, H, dh]
  const float* rel;  // [H, rel_size, dh]: W_r R at distance d in row d
  int64_t rel_size;
  float scale;
  float* out;  // [B, H, dh]
};

// The four scores (qu . k_j + qv . r_j) * scale, j < 4: four independent
// accumulator chains per operand, one horizontal sum per key.
__attribute__((always_inline)) inline void Scores4(const float* qu, const float* qv, const float* const* k,
                                                   const float* const* r, int64_t dh, float scale, float* dst) {
  V8 a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
  int64_t i = 0;
  for (; i + 8 <= dh; i += 8) {
    const V8 u = Load8(qu + i), w = Load8(qv + i);
    a0 += u * Load8(k[0] + i);
    a1 += u * Load8(k[1] + i);
    a2 += u * Load8(k[2] + i);
    a3 += u * Load8(k[3] + i);
    b0 += w * Load8(r[0] + i);
    b1 += w * Load8(r[1] + i);
    b2 += w * Load8(r[2] + i);
    b3 += w * Load8(r[3] + i);
  }
  float s[4] = {Sum8(a0 + b0), Sum8(a1 + b1), Sum8(a2 + b2), Sum8(a3 + b3)};
  for (; i < dh; ++i) {
    for (int j = 0; j < 4; ++j) s[j] += qu[i] * k[j][i] + qv[i] * r[j][i];
  }
  for (int j = 0; j < 4; ++j) dst[j] = s[j] * scale;
}

// exp(x) for x <= 0 in eight lanes: x = n ln2 + r, |r| <= ln2 / 2, e^r by its
// Taylor series to r^7 (truncation below 1 ulp), times 2^n built in the
// exponent bits. Inputs below -87 give e^-87 (a normal float; the caller
// zeroes lanes that must not count).
__attribute__((always_inline)) inline V8 Exp8(V8 x) {
  typedef int32_t V8i __attribute__((vector_size(32)));
  const V8 lowest = {-87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f};
  x = x < lowest ? lowest : x;
  // n = round(x / ln2): adding 1.5 * 2^23 leaves the integer in the low mantissa bits.
  const V8 shifted = x * 1.44269504088896341f + 12582912.f;
  const V8 nf = shifted - 12582912.f;
  V8i n;
  std::memcpy(&n, &shifted, sizeof(n));
  n -= 0x4B400000;
  const V8 r = (x - nf * 0.693145751953125f) - nf * 1.42860682030941723212e-6f;  // ln2 in two parts
  V8 p = r * (1.f / 5040) + (1.f / 720);
  p = p * r + (1.f / 120);
  p = p * r + (1.f / 24);
  p = p * r + (1.f / 6);
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const V8i bits = (n + 127) << 23;
  V8 two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return p * two_n;
}

// One (session, head) per item, head-major (item = h * batch + b), so that a
// thread's run of items reads one head's relative-position rows from cache.
// Per item: the scores of the held keys and the new one into a row buffer (the
// keys read once, in ring order), softmax, then the values read once; finally
// the new key and value go into the ring slot of the position that left the
// window (never one of the held positions, so a failed step changes nothing).
__attribute__((always_inline)) inline void AttendBody(const DecodeArgs& a, int64_t begin, int64_t end) {
  const int64_t H = a.H, dh = a.dh;
  std::vector<float> buffer((a.width + 7) / 8 * 8 + 8);
  float* row = buffer.data();
  for (int64_t t = begin; t < end; ++t) {
    const int64_t h = t / a.batch, b = t % a.batch;
    const DecodeSession& s = a.sessions[b];
    const int64_t bh = b * H + h;
    const float* qu = a.qu + bh * dh;
    const float* qv = a.qv + bh * dh;
    const float* rel = a.rel + h * a.rel_size * dh;
    const float* knew = a.qkv + ((b * 3 + 1) * H + h) * dh;
    const float* vnew = a.qkv + ((b * 3 + 2) * H + h) * dh;
    const int64_t L = s.length, n = L + 1;  // keys: the held ones in order, then the new one
    const int64_t first = (s.position - L) % s.mem_len;
    const float* k = s.k + h * s.cap * dh;
    const float* v = s.v + h * s.cap * dh;
    // Scores: column c < L is the held position at distance L - c; column L the new token.
    {
      const float* kp[4];
      const float* rp[4];
      int64_t slot = first, c = 0;
      for (; c + 4 <= L; c += 4) {
        for (int j = 0; j < 4; ++j) {
          kp[j] = k + slot * dh;
          rp[j] = rel + (L - c - j) * dh;
          if (++slot == s.mem_len) slot = 0;
        }
        Scores4(qu, qv, kp, rp, dh, a.scale, row + c);
      }
      // The rest (at most 3 held keys and the new one) as one padded group.
      const int64_t rest = n - c;
      float tail[4];
      for (int j = 0; j < 4; ++j) {
        if (c + j < L) {
          kp[j] = k + slot * dh;
          rp[j] = rel + (L - c - j) * dh;
          if (++slot == s.mem_len) slot = 0;
        } else {
          kp[j] = knew;
          rp[j] = rel;
        }
      }
      Scores4(qu, qv, kp, rp, dh, a.scale, tail);
      for (int64_t j = 0; j < rest; ++j) row[c + j] = tail[j];
    }
    // Softmax numerators exp(score - max) and their sum; the padding lanes
    // up to a multiple of 8 are set to zero after the exponential.
    const int64_t padded = (n + 7) / 8 * 8;
    float max = row[0];
    {
      int64_t c = 0;
      V8 m8 = {row[0], row[0], row[0], row[0], row[0], row[0], row[0], row[0]};
      for (; c + 8 <= n; c += 8) {
        const V8 x = Load8(row + c);
        m8 = x > m8 ? x : m8;
      }
      for (int i = 0; i < 8; ++i) max = std::max(max, m8[i]);
      for (; c < n; ++c) max = std::max(max, row[c]);
    }
    for (int64_t c = n; c < padded; ++c) row[c] = max;
    V8 sum8 = {};
    for (int64_t c = 0; c < padded; c += 8) {
      V8 e = Exp8(Load8(row + c) - max);
      if (c + 8 > n) {
        for (int64_t i = n - c; i < 8; ++i) e[i] = 0.0f;
      }
      std::memcpy(row + c, &e, sizeof(e));
      sum8 += e;
    }
    const float inv = 1.0f / Sum8(sum8);
    // Values: sum of numerator * value, normalised at the end.
    float* out = a.out + bh * dh;
    int64_t slot = first;
    if (dh == 64) {  // the common head size: the sum stays in registers
      V8 acc[8] = {};
      auto add = [&](float p, const float* x) {
        const V8 pv = {p, p, p, p, p, p, p, p};
        for (int i = 0; i < 8; ++i) acc[i] += pv * Load8(x + 8 * i);
      };
      for (int64_t c = 0; c < L; ++c) {
        add(row[c], v + slot * 64);
        if (++slot == s.mem_len) slot = 0;
      }
      add(row[L], vnew);
      for (int i = 0; i < 8; ++i) acc[i] *= inv;
      std::memcpy(out, acc, sizeof(acc));
    } else {
      std::fill(out, out + dh, 0.0f);
      for (int64_t c = 0; c < L; ++c) {
        Axpy(row[c], v + slot * dh, out, dh);
        if (++slot == s.mem_len) slot = 0;
      }
      Axpy(row[L], vnew, out, dh);
      for (int64_t i = 0; i < dh; ++i) out[i] *= inv;
    }
    if (s.mem_len > 1) {
      const int64_t at = h * s.cap * dh + (s.position % s.mem_len) * dh;
      std::memcpy(s.k + at, knew, dh * sizeof(float));
      std::memcpy(s.v + at, vnew, dh * sizeof(float));
    }
  }
}

__attribute__((target("avx2,fma"))) void AttendAvx2(const DecodeArgs& a, int64_t b, int64_t e) {
  AttendBody(a, b, e);
}
void AttendPlain(const DecodeArgs& a, int64_t b, int64_t e) { AttendBody(a, b, e); }


bool HasAvx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
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

IncrementalModel::IncrementalModel(ModelConfig config, TxlWeights weights, at::Device device)
    : config_(std::move(config)), weights_(weights.To(device)), device_(device) {}

void IncrementalModel::EnsureRelTable(int64_t distances) {
  if (distances <= rel_size_) return;
  // Grow geometrically so that sessions with rising mem_len rebuild rarely.
  const int64_t size = std::max({distances, 2 * rel_size_, config_.mem_len});
  at::Tensor pos = PositionEmbedding(
      weights_, ClampedDistances(config_, size, at::TensorOptions().device(device_)));
  rel_k_.clear();
  rel_kt_.clear();
  for (const LayerWeights& L : weights_.layers) {
    rel_k_.push_back(at::linear(pos, L.r_w).view({size, config_.n_head, config_.d_head}));
    rel_kt_.push_back(rel_k_.back().permute({1, 0, 2}).contiguous());
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
  std::vector<at::Tensor> k(n), v(n);
  for (int64_t l = 0; l < n; ++l) {
    k[l] = at::empty({config_.n_head, cap, config_.d_head}, opts);
    v[l] = at::empty({config_.n_head, cap, config_.d_head}, opts);
    if (m->capacity_ > 0) {  // not wrapped yet: slot == position
      k[l].slice(1, 0, m->capacity_).copy_(m->k_[l]);
      v[l].slice(1, 0, m->capacity_).copy_(m->v_[l]);
    }
  }
  m->k_.swap(k);
  m->v_.swap(v);
  m->capacity_ = cap;
}

at::Tensor IncrementalModel::Step(absl::Span<StepItem> items) {
  std::vector<Pending> pending;
  pending.reserve(items.size());
  int64_t max_n = 0;
  for (StepItem& item : items) {
    SessionMemory* m = item.memory;
    const int64_t n = static_cast<int64_t>(item.tokens.size());
    // Room for every position the step will hold (contents kept: invisible).
    if (n > 0 && m->mem_len_ > 1) Reserve(m, std::min(m->mem_len_, m->position_ + n));
    pending.push_back({m, m->length_, m->position_, std::vector<at::Tensor>(m->k_.size()),
                       std::vector<at::Tensor>(m->v_.size())});
    max_n = std::max(max_n, n);
  }
  const bool can_decode = device_.is_cpu() && weights_.layers[0].qkv_w.scalar_type() == at::kFloat;
  std::vector<std::vector<at::Tensor>> parts(items.size());
  for (int64_t start = 0; start < max_n; start += kPassTokens) {
    std::vector<Pending*> batch;
    std::vector<std::vector<int64_t>> tokens;
    std::vector<size_t> which;
    bool decode = can_decode;
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& t = items[i].tokens;
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
  for (size_t i = 0; i < items.size(); ++i) {
    SessionMemory* mem = items[i].memory;
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

at::Tensor IncrementalModel::DecodePass(std::vector<Pending*>& batch,
                                        const std::vector<std::vector<int64_t>>& tokens) {
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
  DecodeArgs args;
  args.sessions = sessions.data();
  args.batch = B;
  args.H = H;
  args.dh = dh;
  args.width = width;
  args.rel_size = rel_size_;
  args.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)));
  args.out = vec.data_ptr<float>();
  // One row: matrix-vector products. (linear() on one row runs a GEMM that
  // packs the whole weight matrix first: about 2x the memory traffic.)
  auto Linear = [B](const at::Tensor& in, const at::Tensor& w, const at::Tensor& bias) {
    if (B != 1) return at::linear(in, w, bias);
    at::Tensor y = bias.defined() ? at::addmv(bias, w, in.view({in.size(-1)})) : at::mv(w, in.view({in.size(-1)}));
    return y.unsqueeze(0);
  };
  const bool avx2 = HasAvx2();
  const int64_t grain = std::max<int64_t>(1, (B * H) / (4 * at::get_num_threads()));

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = weights_.layers[l];
    for (int64_t b = 0; b < B; ++b) {
      SessionMemory* m = batch[b]->memory;
      const bool ring = m->mem_len_ > 1;
      sessions[b] = {ring ? m->k_[l].data_ptr<float>() : nullptr, ring ? m->v_[l].data_ptr<float>() : nullptr,
                     m->capacity_, m->mem_len_, batch[b]->position, batch[b]->length};
    }
    at::Tensor h = c.pre_lnorm ? LayerNorm(x, L.attn_ln_w, L.attn_ln_b) : x;
    at::Tensor qkv = Linear(h, L.qkv_w, at::Tensor()).contiguous();  // [B, 3H dh]
    at::Tensor q = qkv.view({B, 3, H, dh}).select(1, 0);
    at::Tensor qu = (q + weights_.u(c, l)).contiguous(), qv = (q + weights_.v(c, l)).contiguous();
    args.qu = qu.data_ptr<float>();
    args.qv = qv.data_ptr<float>();
    args.qkv = qkv.data_ptr<float>();
    args.rel = rel_kt_[l].data_ptr<float>();
    at::parallel_for(0, B * H, grain, [&](int64_t begin, int64_t end) {
      avx2 ? AttendAvx2(args, begin, end) : AttendPlain(args, begin, end);
    });
    at::Tensor out = Linear(vec, L.o_w, at::Tensor());
    x = c.pre_lnorm ? x + out : LayerNorm(x + out, L.attn_ln_w, L.attn_ln_b);
    // FeedForward (txl_math.h), with the same Linear.
    auto core = [&](const at::Tensor& in) {
      return Linear(at::relu(Linear(in, L.ff1_w, L.ff1_b)), L.ff2_w, L.ff2_b);
    };
    x = c.pre_lnorm ? x + core(LayerNorm(x, L.ff_ln_w, L.ff_ln_b)) : LayerNorm(x + core(x), L.ff_ln_w, L.ff_ln_b);
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t M = batch[b]->memory->mem_len_;
    batch[b]->length = std::min(M - 1, batch[b]->length + 1);
  }
  return x;
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
  masked = masked.unsqueeze(1);                                     // [B, 1, N, Kmax]
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

// (GCC reports -Wpsabi for the vector helpers at the end of the file.)
#pragma GCC diagnostic pop

}  // namespace txl
