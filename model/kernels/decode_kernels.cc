#include "model/kernels/decode_kernels.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "model/kernels/simd.h"

namespace txl {

namespace {

using namespace simd;  // NOLINT: the vector helpers are this file's vocabulary

// acc += q . x over the 2 * lanes elements at x. Split: x is bfloat16 and
// q is stored de-interleaved per block (its even elements, then its odd ones;
// SplitBf16).
template <typename V, typename T, int kIsa, bool kSplit>
__attribute__((always_inline)) inline void AddBlock2(const float* q, const T* x, V& acc) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V q0, q1;
  std::memcpy(&q0, q, sizeof(q0));
  std::memcpy(&q1, q + kLanes, sizeof(q1));
  if constexpr (kSplit) {
    V even, odd;
    SplitBf16(x, &even, &odd);
    acc += q0 * even;
    acc += q1 * odd;
  } else {
    acc += q0 * LoadAs<V, T, kIsa>(x);
    acc += q1 * LoadAs<V, T, kIsa>(x + kLanes);
  }
}

// The four scores (qu . k_j + qv . r_j) * scale, j < 4: four independent
// accumulator chains per operand, one horizontal sum per key. Keys are of
// the rings' type KT, position rows of the table's type RT. kPairs: dh is a
// multiple of 2 * lanes, and bfloat16 operands are read split (AddBlock2):
// fewer instructions per byte keep more of a step's loads in flight.
template <typename V, typename KT, typename RT, int kIsa, bool kPairs>
__attribute__((always_inline)) inline void Scores4(const float* qu, const float* qv, const KT* const* k,
                                                   const RT* const* r, int64_t dh, float scale, float* dst) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
  int64_t i = 0;
  if constexpr (kPairs) {
    constexpr bool kSplitK = std::is_same_v<KT, Bf16>, kSplitR = std::is_same_v<RT, Bf16>;
    for (; i < dh; i += 2 * kLanes) {
      AddBlock2<V, KT, kIsa, kSplitK>(qu + i, k[0] + i, a0);
      AddBlock2<V, KT, kIsa, kSplitK>(qu + i, k[1] + i, a1);
      AddBlock2<V, KT, kIsa, kSplitK>(qu + i, k[2] + i, a2);
      AddBlock2<V, KT, kIsa, kSplitK>(qu + i, k[3] + i, a3);
      AddBlock2<V, RT, kIsa, kSplitR>(qv + i, r[0] + i, b0);
      AddBlock2<V, RT, kIsa, kSplitR>(qv + i, r[1] + i, b1);
      AddBlock2<V, RT, kIsa, kSplitR>(qv + i, r[2] + i, b2);
      AddBlock2<V, RT, kIsa, kSplitR>(qv + i, r[3] + i, b3);
    }
  } else {
    for (; i + kLanes <= dh; i += kLanes) {
      V u, w;
      std::memcpy(&u, qu + i, sizeof(u));
      std::memcpy(&w, qv + i, sizeof(w));
      a0 += u * LoadAs<V, KT, kIsa>(k[0] + i);
      a1 += u * LoadAs<V, KT, kIsa>(k[1] + i);
      a2 += u * LoadAs<V, KT, kIsa>(k[2] + i);
      a3 += u * LoadAs<V, KT, kIsa>(k[3] + i);
      b0 += w * LoadAs<V, RT, kIsa>(r[0] + i);
      b1 += w * LoadAs<V, RT, kIsa>(r[1] + i);
      b2 += w * LoadAs<V, RT, kIsa>(r[2] + i);
      b3 += w * LoadAs<V, RT, kIsa>(r[3] + i);
    }
  }
  float s[4] = {SumLanes(a0 + b0), SumLanes(a1 + b1), SumLanes(a2 + b2), SumLanes(a3 + b3)};
  for (; i < dh; ++i) {
    for (int j = 0; j < 4; ++j) s[j] += qu[i] * ToFloat(k[j][i]) + qv[i] * ToFloat(r[j][i]);
  }
  for (int j = 0; j < 4; ++j) dst[j] = s[j] * scale;
}

// Stores q (dh floats) for AddBlock2: de-interleaved per block of 2 * lanes
// when split.
template <int64_t kLanes, bool kSplit>
void StoreQuery(const float* q, int64_t dh, float* out) {
  if constexpr (!kSplit) {
    std::memcpy(out, q, dh * sizeof(float));
  } else {
    for (int64_t b = 0; b < dh; b += 2 * kLanes) {
      for (int64_t m = 0; m < kLanes; ++m) {
        out[b + m] = q[b + 2 * m];
        out[b + kLanes + m] = q[b + 2 * m + 1];
      }
    }
  }
}

// ---- The decode attention (AttendBody), one item (session, head) at a time.
// Its parts take the body's template parameters, all of them, so that each
// instantiation of the body inlines its own copies, as one function did.

// The query plus u and plus v (qu, qv) of head h, stored for Scores4: split
// where the keys (or the position rows) are read split. `biased`: dh floats
// of scratch.
template <typename V, typename KT, typename RT, int kIsa, bool kPairs>
__attribute__((always_inline)) inline void BiasedQueries(const DecodeAttentionArgs& a, const float* q, int64_t h,
                                                         int64_t dh, float* biased, float* qu, float* qv) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  constexpr bool kSplitK = kPairs && std::is_same_v<KT, Bf16>, kSplitR = kPairs && std::is_same_v<RT, Bf16>;
  for (int64_t i = 0; i < dh; ++i) biased[i] = q[i] + a.u[h * dh + i];
  StoreQuery<kLanes, kSplitK>(biased, dh, qu);
  for (int64_t i = 0; i < dh; ++i) biased[i] = q[i] + a.v[h * dh + i];
  StoreQuery<kLanes, kSplitR>(biased, dh, qv);
}

// The new key and value (dh floats each, in qkv) in the rings' type: read
// in place for float32 rings; for bfloat16 ones rounded into `fresh` (2 * dh),
// and qkv's copies set to the rounded values.
template <typename V, typename KT, typename RT, int kIsa, bool kPairs>
__attribute__((always_inline)) inline void FreshKeyValue(float* knew_f, float* vnew_f, int64_t dh, KT* fresh,
                                                         const KT** knew, const KT** vnew) {
  if constexpr (std::is_same_v<KT, float>) {
    *knew = knew_f;
    *vnew = vnew_f;
  } else {
    for (int64_t i = 0; i < dh; ++i) {
      fresh[i].bits = RoundBf16(knew_f[i]);
      fresh[dh + i].bits = RoundBf16(vnew_f[i]);
      knew_f[i] = ToFloat(fresh[i]);
      vnew_f[i] = ToFloat(fresh[dh + i]);
    }
    *knew = fresh;
    *vnew = fresh + dh;
  }
}

// The score pass: row[c] for the L held keys (ring k from slot `first`, the
// keys read once, in ring order) and row[L] for the new key knew. Column
// c < L is the held position at distance L - c.
template <typename V, typename KT, typename RT, int kIsa, bool kPairs>
__attribute__((always_inline)) inline void ScoreRow(const DecodeAttentionArgs& a, const DecodeSession& s, int64_t dh,
                                                    const float* qu, const float* qv, const KT* k, const KT* v,
                                                    const RT* rel, const KT* knew, int64_t L, int64_t first,
                                                    float* row) {
  const int64_t n = L + 1;
  constexpr int64_t kElemBytes = static_cast<int64_t>(sizeof(KT));
  // Keys fetched this many rows ahead: 24 float32 rows (measured), the same
  // bytes in narrower rows.
  constexpr int64_t kAhead = 24 * 4 / kElemBytes;
  constexpr int64_t kRelAhead = 24 * 4 / static_cast<int64_t>(sizeof(RT));
  const KT* kp[4];
  const RT* rp[4];
  int64_t slot = first, c = 0;
  for (; c + 4 <= L; c += 4) {
    for (int j = 0; j < 4; ++j) {
      kp[j] = k + slot * dh;
      rp[j] = rel + (L - c - j) * dh;
      // The values pass reads these rows next: fetch them while the
      // scores compute, so that pass runs from cache. And fetch the keys
      // 24 rows ahead (measured: 2-4% off a 32-session step).
      const char* vr = reinterpret_cast<const char*>(v + slot * dh);
      for (int64_t off = 0; off < dh * kElemBytes; off += 64) __builtin_prefetch(vr + off, 0, 1);
      int64_t ahead = slot + kAhead;
      if (ahead >= s.mem_len) ahead -= s.mem_len;
      if (ahead < s.cap) {
        const char* kr = reinterpret_cast<const char*>(k + ahead * dh);
        for (int64_t off = 0; off < dh * kElemBytes; off += 64) __builtin_prefetch(kr + off);
      }
      // The position table is read backwards (distance L - c down to 1).
      if (L - c - j - kRelAhead >= 0) {
        const char* rr = reinterpret_cast<const char*>(rel + (L - c - j - kRelAhead) * dh);
        for (int64_t off = 0; off < dh * static_cast<int64_t>(sizeof(RT)); off += 64) __builtin_prefetch(rr + off);
      }
      if (++slot == s.mem_len) slot = 0;
    }
    Scores4<V, KT, RT, kIsa, kPairs>(qu, qv, kp, rp, dh, a.scale, row + c);
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
  Scores4<V, KT, RT, kIsa, kPairs>(qu, qv, kp, rp, dh, a.scale, tail);
  for (int64_t j = 0; j < rest; ++j) row[c + j] = tail[j];
}

// The softmax of the n scores in row: its numerators exp(score - max) in
// place, and 1 / their sum returned. The row's padding lanes up to a
// multiple of 8 are set to zero after the exponential.
template <typename V, typename KT, typename RT, int kIsa, bool kPairs>
__attribute__((always_inline)) inline float SoftmaxNumerators(float* row, int64_t n) {
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
  return 1.0f / Sum8(sum8);
}

// The value pass for the common head size 64: out = inv * (sum of
// numerator * value) over the L held values (ring v from slot `first`) and
// the new one, the sum kept in registers.
template <typename V, typename KT, typename RT, int kIsa, bool kPairs>
__attribute__((always_inline)) inline void WeighValues64(const DecodeSession& s, const float* row, const KT* v,
                                                         const KT* vnew, int64_t L, int64_t first, float inv,
                                                         float* out) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  constexpr bool kSplitK = kPairs && std::is_same_v<KT, Bf16>;
  int64_t slot = first;
  constexpr int kParts = 64 / kLanes;
  V acc[kParts] = {};  // split: even and odd elements of each block of 2 * lanes, alternately
  // always_inline: as WeighValues' axpy.
  auto add = [&](float p, const KT* x) __attribute__((always_inline)) {
    V pv;
    for (int l = 0; l < kLanes; ++l) pv[l] = p;
    if constexpr (kSplitK) {
#pragma GCC unroll 8
      for (int i = 0; i < kParts; i += 2) {
        V even, odd;
        SplitBf16(x + kLanes * i, &even, &odd);
        acc[i] += pv * even;
        acc[i + 1] += pv * odd;
      }
    } else {
#pragma GCC unroll 8
      for (int i = 0; i < kParts; ++i) acc[i] += pv * LoadAs<V, KT, kIsa>(x + kLanes * i);
    }
  };
  for (int64_t c = 0; c < L; ++c) {
    add(row[c], v + slot * 64);
    if (++slot == s.mem_len) slot = 0;
  }
  add(row[L], vnew);
  for (int i = 0; i < kParts; ++i) acc[i] *= inv;
  if constexpr (kSplitK) {
    for (int i = 0; i < kParts; i += 2) {
      for (int m = 0; m < kLanes; ++m) {
        out[kLanes * i + 2 * m] = acc[i][m];
        out[kLanes * i + 2 * m + 1] = acc[i + 1][m];
      }
    }
  } else {
    std::memcpy(out, acc, sizeof(acc));
  }
}

// The value pass for any head size dh: the same sum, accumulated in out.
template <typename V, typename KT, typename RT, int kIsa, bool kPairs>
__attribute__((always_inline)) inline void WeighValues(const DecodeSession& s, int64_t dh, const float* row,
                                                       const KT* v, const KT* vnew, int64_t L, int64_t first, float inv,
                                                       float* out) {
  int64_t slot = first;
  std::fill(out, out + dh, 0.0f);
  // always_inline: without it GCC's flatten left the bfloat16 loads
  // (WidenBf16x8) out of line here.
  auto axpy = [&](float p, const KT* x) __attribute__((always_inline)) {
    int64_t i = 0;
    const V8 pv = {p, p, p, p, p, p, p, p};
    for (; i + 8 <= dh; i += 8) {
      V8 r = Load8(out + i) + pv * LoadAs<V8, KT, kIsa>(x + i);
      std::memcpy(out + i, &r, sizeof(r));
    }
    for (; i < dh; ++i) out[i] += p * ToFloat(x[i]);
  };
  for (int64_t c = 0; c < L; ++c) {
    axpy(row[c], v + slot * dh);
    if (++slot == s.mem_len) slot = 0;
  }
  axpy(row[L], vnew);
  for (int64_t i = 0; i < dh; ++i) out[i] *= inv;
}

// The ring write: the new key and value of head h into the slot of the
// session's position (a window of 1 keeps nothing).
template <typename V, typename KT, typename RT, int kIsa, bool kPairs>
__attribute__((always_inline)) inline void WriteRingSlot(const DecodeSession& s, int64_t h, int64_t dh, const KT* knew,
                                                         const KT* vnew) {
  if (s.mem_len > 1) {
    const int64_t at = h * s.cap * dh + (s.position % s.mem_len) * dh;
    std::memcpy(static_cast<KT*>(s.k) + at, knew, dh * sizeof(KT));
    std::memcpy(static_cast<KT*>(s.v) + at, vnew, dh * sizeof(KT));
  }
}

// Per item: the scores of the held keys and the new one into a row buffer (the
// keys read once, in ring order), softmax, then the values read once.
template <typename V, typename KT, typename RT, int kIsa, bool kPairs>
__attribute__((always_inline)) inline void AttendBody(const DecodeAttentionArgs& a, int64_t begin, int64_t end) {
  const int64_t H = a.H, dh = a.dh;
  std::vector<float> buffer((a.width + 7) / 8 * 8 + 8 + 3 * dh);
  std::vector<KT> fresh(2 * dh);  // the new key and value, in the rings' type
  float* qu = buffer.data();      // query + u, query + v
  float* qv = qu + dh;
  float* biased = qv + dh;  // the query plus a bias, in order
  float* row = biased + dh;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t h = t / a.batch, b = t % a.batch;
    const DecodeSession& s = a.sessions[b];
    const int64_t bh = b * H + h;
    const float* q = a.qkv + (b * 3 * H + h) * dh;
    BiasedQueries<V, KT, RT, kIsa, kPairs>(a, q, h, dh, biased, qu, qv);
    const RT* rel = static_cast<const RT*>(a.rel) + h * a.rel_size * dh;
    const KT* knew;
    const KT* vnew;
    FreshKeyValue<V, KT, RT, kIsa, kPairs>(a.qkv + ((b * 3 + 1) * H + h) * dh, a.qkv + ((b * 3 + 2) * H + h) * dh, dh,
                                           fresh.data(), &knew, &vnew);
    const int64_t L = s.length, n = L + 1;  // keys: the held ones in order, then the new one
    const int64_t first = (s.position - L) % s.mem_len;
    const KT* k = static_cast<const KT*>(s.k) + h * s.cap * dh;
    const KT* v = static_cast<const KT*>(s.v) + h * s.cap * dh;
    ScoreRow<V, KT, RT, kIsa, kPairs>(a, s, dh, qu, qv, k, v, rel, knew, L, first, row);
    const float inv = SoftmaxNumerators<V, KT, RT, kIsa, kPairs>(row, n);
    // Values: sum of numerator * value, normalised at the end (the values
    // come from cache: fetched during the scores).
    float* out = a.out + bh * dh;
    if (dh == 64) {  // the common head size: the sum stays in registers
      WeighValues64<V, KT, RT, kIsa, kPairs>(s, row, v, vnew, L, first, inv, out);
    } else {
      WeighValues<V, KT, RT, kIsa, kPairs>(s, dh, row, v, vnew, L, first, inv, out);
    }
    WriteRingSlot<V, KT, RT, kIsa, kPairs>(s, h, dh, knew, vnew);
  }
}

// Four rows at a time: x is read from L1 once per four weight rows; four
// accumulators, one horizontal sum per row. V: float vector type; T: the
// weights' element type (int8 rows are scaled after the sum). Narrow rows
// are short (1 KB or 512 B at d_model 512), so the hardware's stream
// prefetch may never get going: they fetch wm.ahead rows on (on the AMD
// EPYC, 16 took the int8 step from 2.25 to 1.70 ms; OPTIMISATIONS step 16).
template <typename V, typename T, int kIsa>
__attribute__((always_inline)) inline void GemvBody(const WeightMatrix& wm, const float* x, const float* bias,
                                                    bool relu, float* y, int64_t cols, int64_t begin, int64_t end) {
  constexpr int kLanes = sizeof(V) / sizeof(float);
  constexpr bool kNarrow = !std::is_same_v<T, float>;
  const T* w = static_cast<const T*>(wm.data);
  const int64_t ld = wm.ld;
  auto finish = [&](int64_t r, float s) {
    if constexpr (std::is_same_v<T, int8_t>) s *= wm.scale[r];
    const float out = bias ? s + bias[r] : s;
    y[r] = relu && out < 0 ? 0.0f : out;
  };
  int64_t r = begin;
  for (; r + 4 <= end; r += 4) {
    const T* w0 = w + r * ld;
    const T* w1 = w0 + ld;
    const T* w2 = w1 + ld;
    const T* w3 = w2 + ld;
    V a0 = {}, a1 = {}, a2 = {}, a3 = {};
    int64_t c = 0;
    const T* ahead = w0 + wm.ahead * ld;
    for (; c + kLanes <= cols; c += kLanes) {
      if (kNarrow && wm.ahead > 0 && (c * static_cast<int64_t>(sizeof(T))) % 64 == 0) {
        __builtin_prefetch(ahead + c);
        __builtin_prefetch(ahead + ld + c);
        __builtin_prefetch(ahead + 2 * ld + c);
        __builtin_prefetch(ahead + 3 * ld + c);
      }
      V xv;
      std::memcpy(&xv, x + c, sizeof(xv));
      a0 += LoadAs<V, T, kIsa>(w0 + c) * xv;
      a1 += LoadAs<V, T, kIsa>(w1 + c) * xv;
      a2 += LoadAs<V, T, kIsa>(w2 + c) * xv;
      a3 += LoadAs<V, T, kIsa>(w3 + c) * xv;
    }
    float s[4] = {SumLanes<V>(a0), SumLanes<V>(a1), SumLanes<V>(a2), SumLanes<V>(a3)};
    for (; c < cols; ++c) {
      s[0] += ToFloat(w0[c]) * x[c];
      s[1] += ToFloat(w1[c]) * x[c];
      s[2] += ToFloat(w2[c]) * x[c];
      s[3] += ToFloat(w3[c]) * x[c];
    }
    for (int j = 0; j < 4; ++j) finish(r + j, s[j]);
  }
  for (; r < end; ++r) {
    const T* row = w + r * ld;
    V acc = {};
    int64_t c = 0;
    for (; c + kLanes <= cols; c += kLanes) {
      V xv;
      std::memcpy(&xv, x + c, sizeof(xv));
      acc += LoadAs<V, T, kIsa>(row + c) * xv;
    }
    float s = SumLanes<V>(acc);
    for (; c < cols; ++c) s += ToFloat(row[c]) * x[c];
    finish(r, s);
  }
}

// acc += column c's (pairs: pair c's) vector j of a panel, times x; `half`:
// a pair's even column only (a block's last column, when its width is odd).
// A function, not a lambda: clang (the sanitizer builds) would compile a
// lambda for the base instruction set, without the caller's FMA.
template <typename V, typename T, int kIsa>
__attribute__((always_inline)) inline void PanelStep(const T* panel, const float* x, int64_t c, int j, V& acc,
                                                     bool half) {
  constexpr int kLanes = sizeof(V) / sizeof(float);
  if constexpr (std::is_same_v<T, Bf16>) {
    V even, odd;
    SplitBf16(panel + 2 * (c * kPanel + j * kLanes), &even, &odd);
    acc += even * x[2 * c];
    if (!half) acc += odd * x[2 * c + 1];
  } else {
    acc += LoadAs<V, float, kIsa>(panel + c * kPanel + j * kLanes) * x[c];
  }
}

// From panels (float32, or bfloat16 in column pairs): each panel of 64 rows
// is [cols, 64], so a column step reads one 64-row stripe into 64 / lanes
// accumulators, and each row's sum runs over the columns in order, a pair's
// even column first (PackedProduct's Tile and PairTile, x kept float32).
// Rows [begin, end) need not be whole panels: a part-panel reads only the
// vectors that hold its rows. A bfloat16 block starts at an even column.
template <typename V, typename T, int kIsa>
__attribute__((always_inline)) inline void GemvPanelBody(const WeightMatrix& wm, const float* x, const float* bias,
                                                         bool relu, float* y, int64_t cols, int64_t begin,
                                                         int64_t end) {
  constexpr int kLanes = sizeof(V) / sizeof(float);
  constexpr int kVectors = kPanel / kLanes;
  constexpr bool kPairs = std::is_same_v<T, Bf16>;
  const T* w = static_cast<const T*>(wm.data);
  const int64_t steps = kPairs ? cols / 2 : cols;
  const bool tail = kPairs && cols % 2 == 1;
  for (int64_t p = begin / kPanel; p * kPanel < end; ++p) {
    const T* panel = w + p * wm.ld * kPanel;
    const int64_t lo = std::max(begin, p * kPanel) - p * kPanel, hi = std::min(end, (p + 1) * kPanel) - p * kPanel;
    const int j0 = static_cast<int>(lo / kLanes), j1 = static_cast<int>((hi + kLanes - 1) / kLanes);
    V acc[kVectors] = {};
    if (j0 == 0 && j1 == kVectors) {
      for (int64_t c = 0; c < steps; ++c) {
#pragma GCC unroll 8
        for (int j = 0; j < kVectors; ++j) PanelStep<V, T, kIsa>(panel, x, c, j, acc[j], false);
      }
    } else {
      for (int64_t c = 0; c < steps; ++c) {
        for (int j = j0; j < j1; ++j) PanelStep<V, T, kIsa>(panel, x, c, j, acc[j], false);
      }
    }
    if (tail) {
      for (int j = j0; j < j1; ++j) PanelStep<V, T, kIsa>(panel, x, steps, j, acc[j], true);
    }
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t r = p * kPanel + i;
      const float out = bias ? acc[i / kLanes][i % kLanes] + bias[r] : acc[i / kLanes][i % kLanes];
      y[r] = relu && out < 0 ? 0.0f : out;
    }
  }
}

// The kernels' entry points, one body each for every instruction set
// (cpu_isa.h). Attend reads head rows in pairs of vectors where dh allows.
template <typename KT, typename RT>
struct AttendKernel {
  template <int kBits>
  __attribute__((always_inline)) static void Run(const DecodeAttentionArgs& a, int64_t b, int64_t e) {
    using V = std::conditional_t<kBits == 512, V16, V8>;
    constexpr int64_t kPair = 2 * static_cast<int64_t>(sizeof(V) / sizeof(float));
    if (a.dh % kPair == 0) return AttendBody<V, KT, RT, kBits, true>(a, b, e);
    AttendBody<V, KT, RT, kBits, false>(a, b, e);
  }
};

template <typename T>
struct GemvKernel {
  template <int kBits>
  __attribute__((always_inline)) static void Run(const WeightMatrix& w, const float* x, const float* bias, bool relu,
                                                 float* y, int64_t cols, int64_t b, int64_t e) {
    using V = std::conditional_t<kBits == 512, V16, V8>;
    if constexpr (!std::is_same_v<T, int8_t>) {
      if (w.panels) return GemvPanelBody<V, T, kBits>(w, x, bias, relu, y, cols, b, e);
    }
    GemvBody<V, T, kBits>(w, x, bias, relu, y, cols, b, e);
  }
};

}  // namespace

int64_t ElemBytes(Elem e) { return e == Elem::kF32 ? 4 : e == Elem::kBf16 ? 2 : 1; }

WeightMatrix WeightMatrix::Block(int64_t row, int64_t col) const {
  WeightMatrix b = *this;
  const int64_t at = panels ? row * ld + col * kPanel : row * ld + col;  // panels: row / kPanel panels of ld * kPanel
  b.data = static_cast<const char*>(data) + at * ElemBytes(elem);
  if (scale != nullptr) b.scale = scale + row;
  return b;
}

uint16_t ToBf16(float f) { return RoundBf16(f); }

void RoundToBf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(ToBf16(x[i])) << 16;
    std::memcpy(&x[i], &u, sizeof(u));
  }
}

void DecodeAttention(const DecodeAttentionArgs& args, int64_t begin, int64_t end, KernelIsa isa) {
  const bool kv16 = args.kv == Elem::kBf16, rel16 = args.rel_elem == Elem::kBf16;
  if (kv16 && rel16) return DispatchIsa<AttendKernel<Bf16, Bf16>>(isa, args, begin, end);
  if (kv16) return DispatchIsa<AttendKernel<Bf16, float>>(isa, args, begin, end);
  if (rel16) return DispatchIsa<AttendKernel<float, Bf16>>(isa, args, begin, end);
  DispatchIsa<AttendKernel<float, float>>(isa, args, begin, end);
}

void GemvRows(const WeightMatrix& w, const float* x, const float* bias, bool relu, float* y, int64_t cols,
              int64_t begin, int64_t end, KernelIsa isa) {
  switch (w.elem) {
    case Elem::kBf16: return DispatchIsa<GemvKernel<Bf16>>(isa, w, x, bias, relu, y, cols, begin, end);
    case Elem::kI8: return DispatchIsa<GemvKernel<int8_t>>(isa, w, x, bias, relu, y, cols, begin, end);
    default:
      // float32 rows stay on AVX2: measured no faster on AVX-512 (bound by
      // memory). Panels sum each row in column order whatever the width.
      if (!w.panels && ResolveIsa(isa) == KernelIsa::kAvx512) isa = KernelIsa::kAvx2;
      return DispatchIsa<GemvKernel<float>>(isa, w, x, bias, relu, y, cols, begin, end);
  }
}

}  // namespace txl
