#include "model/decode_kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace txl {

// Written with GCC vector extensions, so one body serves every instruction
// set it is compiled for. (-Wpsabi would note that the vector helpers pass
// AVX values, which never cross this file's boundary.)
#pragma GCC diagnostic ignored "-Wpsabi"

namespace {

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

// Per item: the scores of the held keys and the new one into a row buffer (the
// keys read once, in ring order), softmax, then the values read once.
__attribute__((always_inline)) inline void AttendBody(const DecodeAttentionArgs& a, int64_t begin, int64_t end) {
  const int64_t H = a.H, dh = a.dh;
  std::vector<float> buffer((a.width + 7) / 8 * 8 + 8 + 2 * dh);
  float* qu = buffer.data();  // query + u, query + v
  float* qv = qu + dh;
  float* row = qv + dh;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t h = t / a.batch, b = t % a.batch;
    const DecodeSession& s = a.sessions[b];
    const int64_t bh = b * H + h;
    const float* q = a.qkv + (b * 3 * H + h) * dh;
    for (int64_t i = 0; i < dh; ++i) {
      qu[i] = q[i] + a.u[h * dh + i];
      qv[i] = q[i] + a.v[h * dh + i];
    }
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
          // The values pass reads these rows next: fetch them while the
          // scores compute, so that pass runs from cache. And fetch the keys
          // 24 rows ahead (measured: 2-4% off a 32-session step).
          const char* vr = reinterpret_cast<const char*>(v + slot * dh);
          for (int64_t off = 0; off < dh * 4; off += 64) __builtin_prefetch(vr + off);
          int64_t ahead = slot + 24;
          if (ahead >= s.mem_len) ahead -= s.mem_len;
          if (ahead < s.cap) {
            const char* kr = reinterpret_cast<const char*>(k + ahead * dh);
            for (int64_t off = 0; off < dh * 4; off += 64) __builtin_prefetch(kr + off);
          }
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
    // Values: sum of numerator * value, normalised at the end (the values
    // come from cache: fetched during the scores).
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

// Four rows at a time: x is read from L1 once per four weight rows; four
// accumulators, one horizontal sum per row.
__attribute__((always_inline)) inline void GemvBody(const float* w, int64_t ld, const float* x, const float* bias,
                                                    bool relu, float* y, int64_t cols, int64_t begin, int64_t end) {
  int64_t r = begin;
  for (; r + 4 <= end; r += 4) {
    const float* w0 = w + r * ld;
    const float* w1 = w0 + ld;
    const float* w2 = w1 + ld;
    const float* w3 = w2 + ld;
    V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const V8 xv = Load8(x + c);
      a0 += Load8(w0 + c) * xv;
      a1 += Load8(w1 + c) * xv;
      a2 += Load8(w2 + c) * xv;
      a3 += Load8(w3 + c) * xv;
    }
    float s[4] = {Sum8(a0), Sum8(a1), Sum8(a2), Sum8(a3)};
    for (; c < cols; ++c) {
      s[0] += w0[c] * x[c];
      s[1] += w1[c] * x[c];
      s[2] += w2[c] * x[c];
      s[3] += w3[c] * x[c];
    }
    for (int j = 0; j < 4; ++j) {
      const float out = bias ? s[j] + bias[r + j] : s[j];
      y[r + j] = relu && out < 0 ? 0.0f : out;
    }
  }
  for (; r < end; ++r) {
    const float* row = w + r * ld;
    V8 a = {};
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) a += Load8(row + c) * Load8(x + c);
    float s = Sum8(a);
    for (; c < cols; ++c) s += row[c] * x[c];
    const float out = bias ? s + bias[r] : s;
    y[r] = relu && out < 0 ? 0.0f : out;
  }
}

__attribute__((target("avx2,fma"))) void AttendAvx2(const DecodeAttentionArgs& a, int64_t b, int64_t e) {
  AttendBody(a, b, e);
}
void AttendPlain(const DecodeAttentionArgs& a, int64_t b, int64_t e) { AttendBody(a, b, e); }

__attribute__((target("avx2,fma"))) void GemvAvx2(const float* w, int64_t ld, const float* x, const float* bias,
                                                  bool relu, float* y, int64_t cols, int64_t b, int64_t e) {
  GemvBody(w, ld, x, bias, relu, y, cols, b, e);
}
void GemvPlain(const float* w, int64_t ld, const float* x, const float* bias, bool relu, float* y, int64_t cols,
               int64_t b, int64_t e) {
  GemvBody(w, ld, x, bias, relu, y, cols, b, e);
}

// ---- Packed products. A tile is R input rows x NV vectors of W lanes; its
// R * NV accumulators stay in registers over the whole dot product (AVX-512:
// 7 x 4 zmm, AVX2: 6 x 2 ymm over each quarter of a panel).
template <typename V, int W, int NV, int R>
__attribute__((always_inline)) inline void Tile(const float* panel, int64_t cols, const float* x, int64_t ldx, float* y,
                                                int64_t ldy, int64_t valid, const float* bias, bool relu,
                                                const char* prefetch, int64_t lines) {
  V acc[R][NV] = {};
  const int64_t per_k = (lines + cols - 1) / cols;
  int64_t line = 0;
  for (int64_t k = 0; k < cols; ++k) {
    for (int64_t q = 0; q < per_k && line < lines; ++q, ++line) __builtin_prefetch(prefetch + 64 * line);
    V w[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) std::memcpy(&w[j], panel + k * kPanel + j * W, sizeof(V));
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const float xs = x[i * ldx + k];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] += w[j] * xs;
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < NV; ++j) {
      for (int lane = 0; lane < W && j * W + lane < valid; ++lane) {
        const int64_t col = j * W + lane;
        const float out = bias ? acc[i][j][lane] + bias[col] : acc[i][j][lane];
        y[i * ldy + col] = relu && out < 0 ? 0.0f : out;
      }
    }
  }
}

// A panel's first tile streams it from memory, the others find it in cache;
// those others also fetch the next panel, a share each, so the memory keeps
// streaming while they compute.
template <typename V, int W, int NV>
__attribute__((always_inline)) inline void ProductBody(const float* packed, int64_t rows, int64_t cols, const float* x,
                                                       int64_t batch, const float* bias, bool relu, float* y,
                                                       int64_t begin, int64_t end) {
  constexpr int kTile = W * NV;
  // Rows per tile: 7 x 4 accumulators + 4 weight vectors fill AVX-512's 32
  // registers (7 rows measured 7% faster than 6 at 32 sessions); AVX2 has 16.
  constexpr int kRows = NV == 4 ? 7 : 6;
  const int64_t panel_lines = cols * kPanel * static_cast<int64_t>(sizeof(float)) / 64;
  for (int64_t p = begin; p < end; ++p) {
    const float* panel = packed + p * cols * kPanel;
    const int64_t subs = std::min<int64_t>(kPanel, rows - p * kPanel + kTile - 1) / kTile;
    const int64_t units = subs * ((batch + kRows - 1) / kRows);
    const char* next = p + 1 < end ? reinterpret_cast<const char*>(panel + cols * kPanel) : nullptr;
    int64_t unit = 0;
    for (int64_t sub = 0; sub < subs * kTile; sub += kTile) {
      const int64_t r0 = p * kPanel + sub;
      const int64_t valid = std::min<int64_t>(kTile, rows - r0);
      const float* b = bias ? bias + r0 : nullptr;
      for (int64_t m = 0; m < batch; m += kRows, ++unit) {
        const float* xm = x + m * cols;
        float* ym = y + m * rows + r0;
        const char* pf = nullptr;
        int64_t lines = 0;
        if (next != nullptr && unit > 0) {
          const int64_t from = (unit - 1) * panel_lines / (units - 1), to = unit * panel_lines / (units - 1);
          pf = next + 64 * from;
          lines = to - from;
        }
        switch (std::min<int64_t>(kRows, batch - m)) {
          case 7:
            if constexpr (kRows >= 7)
              Tile<V, W, NV, 7>(panel + sub, cols, xm, cols, ym, rows, valid, b, relu, pf, lines);
            break;
          case 6: Tile<V, W, NV, 6>(panel + sub, cols, xm, cols, ym, rows, valid, b, relu, pf, lines); break;
          case 5: Tile<V, W, NV, 5>(panel + sub, cols, xm, cols, ym, rows, valid, b, relu, pf, lines); break;
          case 4: Tile<V, W, NV, 4>(panel + sub, cols, xm, cols, ym, rows, valid, b, relu, pf, lines); break;
          case 3: Tile<V, W, NV, 3>(panel + sub, cols, xm, cols, ym, rows, valid, b, relu, pf, lines); break;
          case 2: Tile<V, W, NV, 2>(panel + sub, cols, xm, cols, ym, rows, valid, b, relu, pf, lines); break;
          default: Tile<V, W, NV, 1>(panel + sub, cols, xm, cols, ym, rows, valid, b, relu, pf, lines); break;
        }
      }
    }
  }
}

typedef float V16 __attribute__((vector_size(64)));

__attribute__((target("avx512f"))) void ProductAvx512(const float* packed, int64_t rows, int64_t cols, const float* x,
                                                      int64_t batch, const float* bias, bool relu, float* y, int64_t b,
                                                      int64_t e) {
  ProductBody<V16, 16, 4>(packed, rows, cols, x, batch, bias, relu, y, b, e);
}
__attribute__((target("avx2,fma"))) void ProductAvx2(const float* packed, int64_t rows, int64_t cols, const float* x,
                                                     int64_t batch, const float* bias, bool relu, float* y, int64_t b,
                                                     int64_t e) {
  ProductBody<V8, 8, 2>(packed, rows, cols, x, batch, bias, relu, y, b, e);
}
void ProductPlain(const float* packed, int64_t rows, int64_t cols, const float* x, int64_t batch, const float* bias,
                  bool relu, float* y, int64_t b, int64_t e) {
  ProductBody<V8, 8, 2>(packed, rows, cols, x, batch, bias, relu, y, b, e);
}

// The widest of the given ones this CPU runs: kBest resolved once, and a
// named set never above what the CPU has.
KernelIsa Resolve(KernelIsa isa) {
  static const KernelIsa best = CpuRuns(KernelIsa::kAvx512) ? KernelIsa::kAvx512
                                : CpuRuns(KernelIsa::kAvx2) ? KernelIsa::kAvx2
                                                            : KernelIsa::kPlain;
  if (isa == KernelIsa::kBest || !CpuRuns(isa)) return best;
  return isa;
}

}  // namespace

bool CpuRuns(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAvx512: return __builtin_cpu_supports("avx512f");
    case KernelIsa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default: return true;
  }
}

void DecodeAttention(const DecodeAttentionArgs& args, int64_t begin, int64_t end, KernelIsa isa) {
  Resolve(isa) == KernelIsa::kPlain ? AttendPlain(args, begin, end) : AttendAvx2(args, begin, end);
}

void GemvRows(const float* w, int64_t ld, const float* x, const float* bias, bool relu, float* y, int64_t cols,
              int64_t begin, int64_t end, KernelIsa isa) {
  Resolve(isa) == KernelIsa::kPlain ? GemvPlain(w, ld, x, bias, relu, y, cols, begin, end)
                                    : GemvAvx2(w, ld, x, bias, relu, y, cols, begin, end);
}

int64_t PackedSize(int64_t rows, int64_t cols) { return (rows + kPanel - 1) / kPanel * kPanel * cols; }

void PackPanels(const float* w, int64_t rows, int64_t cols, float* packed) {
  for (int64_t p = 0; p * kPanel < rows; ++p) {
    float* panel = packed + p * cols * kPanel;
    for (int64_t k = 0; k < cols; ++k) {
      for (int64_t j = 0; j < kPanel; ++j) {
        const int64_t r = p * kPanel + j;
        panel[k * kPanel + j] = r < rows ? w[r * cols + k] : 0.0f;
      }
    }
  }
}

void PackedProduct(const float* packed, int64_t rows, int64_t cols, const float* x, int64_t batch, const float* bias,
                   bool relu, float* y, int64_t begin, int64_t end, KernelIsa isa) {
  switch (Resolve(isa)) {
    case KernelIsa::kAvx512: return ProductAvx512(packed, rows, cols, x, batch, bias, relu, y, begin, end);
    case KernelIsa::kAvx2: return ProductAvx2(packed, rows, cols, x, batch, bias, relu, y, begin, end);
    default: return ProductPlain(packed, rows, cols, x, batch, bias, relu, y, begin, end);
  }
}

}  // namespace txl
