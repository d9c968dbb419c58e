#include "model/kernels/prefill_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/kernels/amx_tiles.h"
#include "model/kernels/simd.h"

namespace txl {

namespace {

using namespace simd;  // NOLINT: the vector helpers are this file's vocabulary

constexpr int64_t kBlock = 16;  // queries per work item: one tile's rows
// Columns of padding on each side of the position table, so that every tile
// a block reads lies inside it (the distances outside [0, rel_size) are
// zero, and outside every window).
constexpr int64_t kTableMargin = 64;

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

__attribute__((always_inline)) inline V16 Load16(const float* p) {
  V16 r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

// n floats (plus bias, if any) as bfloat16 bits.
__attribute__((always_inline)) inline void RoundRow(const float* x, const float* bias, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V8 f = Load8(x + i);
    if (bias) f += Load8(bias + i);
    const U16x8 b = RoundBf16x8(f);
    std::memcpy(out + i, &b, sizeof(b));
  }
  for (; i < n; ++i) out[i] = RoundBf16(bias ? x[i] + bias[i] : x[i]);
}

// Columns [c0, c0 + 16) of a right operand in pairs layout [dh / 2, cols, 2]:
// column c from dh values row(c) (null: zeros). Sixteen at a time, so that
// each line of the layout gets one 64-byte write.
template <typename Row>
__attribute__((always_inline)) inline void PackColumns(Row row, int64_t dh, int64_t cols, int64_t c0, uint16_t* out) {
  uint32_t bits[16][64];  // column, pair
  for (int64_t c = 0; c < 16; ++c) {
    const float* x = row(c0 + c);
    if (x != nullptr) {
      RoundRow(x, nullptr, dh, reinterpret_cast<uint16_t*>(bits[c]));
    } else {
      std::memset(bits[c], 0, dh * 2);
    }
  }
  for (int64_t p = 0; p < dh / 2; ++p) {
    uint32_t line[16];
    for (int64_t c = 0; c < 16; ++c) line[c] = bits[c][p];
    std::memcpy(out + (p * cols + c0) * 2, line, sizeof(line));
  }
}

// out [16, count] (row stride ld floats) = a [16, dh] x b [dh, count], on
// tiles, 16 columns at a time: a is 16 rows of dh bfloat16, b the first
// column of a pairs-layout operand whose lines hold `cols` pairs.
// Registers: tmm4-5 a (per 32 of dh), tmm6-7 b, tmm0 the sums.
inline void RowProducts(const uint16_t* a, int64_t dh, const uint16_t* b, int64_t cols, int64_t count, float* out,
                        int64_t ld) {
  const int64_t a_bytes = dh * 2, b_bytes = cols * 4, out_bytes = ld * 4;
  asm volatile("tileloadd (%0,%1,1), %%tmm4" ::"r"(a), "r"(a_bytes) : "memory");
  if (dh == 64) asm volatile("tileloadd (%0,%1,1), %%tmm5" ::"r"(a + 32), "r"(a_bytes) : "memory");
  for (int64_t c = 0; c < count; c += 16) {
    asm volatile(
        "tilezero %%tmm0\n\t"
        "tileloadd (%0,%1,1), %%tmm6\n\t"
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0" ::"r"(b + c * 2),
        "r"(b_bytes)
        : "memory");
    if (dh == 64) {  // pairs 16..31 of dh: 16 lines further
      asm volatile(
          "tileloadd (%0,%1,1), %%tmm7\n\t"
          "tdpbf16ps %%tmm7, %%tmm5, %%tmm0" ::"r"(b + (16 * cols + c) * 2),
          "r"(b_bytes)
          : "memory");
    }
    asm volatile("tilestored %%tmm0, (%0,%1,1)" ::"r"(out + c), "r"(out_bytes) : "memory");
  }
}

}  // namespace

bool PrefillAttentionRuns(int64_t dh) { return (dh == 32 || dh == 64) && CpuRunsAmx(); }

PrefillAttention::PrefillAttention(const PrefillAttentionArgs& args, PrefillAttentionBuffers* buffers) : a_(args) {
  blocks_ = (a_.n + kBlock - 1) / kBlock;
  rows_ = blocks_ * kBlock;
  keys_ = RoundUp(a_.held + a_.n, 32);
  table_ = RoundUp(a_.rel_size + 2 * kTableMargin, 16);
  const int64_t H = a_.heads, dh = a_.dh;
  auto at_least = [](std::vector<uint16_t>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v.data();
  };
  qu_ = at_least(buffers->qu, H * rows_ * dh);
  qv_ = at_least(buffers->qv, H * rows_ * dh);
  k_ = at_least(buffers->k, H * dh * keys_);
  v_ = at_least(buffers->v, H * dh * keys_);
  r_ = at_least(buffers->r, H * dh * table_);
}

TXL_AVX512 void PrefillAttention::Pack(int64_t begin, int64_t end) {
  const int64_t H = a_.heads, dh = a_.dh, total = a_.held + a_.n;
  const int64_t key_items = keys_ / 16, value_items = keys_ / 32, table_items = table_ / 16;
  // Every item covers all heads, so that the source rows are read in order.
  for (int64_t item = begin; item < end; ++item) {
    if (item < key_items) {  // keys: pair p of key j at line p, column j; absent keys are zero
      for (int64_t h = 0; h < H; ++h) {
        auto key = [&](int64_t j) { return j < total ? a_.keys + j * a_.kv_stride + h * dh : nullptr; };
        PackColumns(key, dh, keys_, item * 16, k_ + h * dh * keys_);
      }
      continue;
    }
    int64_t i = item - key_items;
    if (i < value_items) {  // values: line jp holds keys 2jp and 2jp + 1, interleaved per column
      for (int64_t jp = i * 16; jp < i * 16 + 16; ++jp) {
        const float* even = 2 * jp < total ? a_.values + 2 * jp * a_.kv_stride : nullptr;
        const float* odd = 2 * jp + 1 < total ? a_.values + (2 * jp + 1) * a_.kv_stride : nullptr;
        for (int64_t h = 0; h < H; ++h) {
          uint16_t e[64] = {}, o[64] = {};
          if (even) RoundRow(even + h * dh, nullptr, dh, e);
          if (odd) RoundRow(odd + h * dh, nullptr, dh, o);
          uint16_t* line = v_ + (h * keys_ / 2 + jp) * dh * 2;
          for (int64_t d = 0; d < dh; ++d) {
            line[2 * d] = e[d];
            line[2 * d + 1] = o[d];
          }
        }
      }
      continue;
    }
    i -= value_items;
    if (i < table_items) {  // position rows reversed: column e holds distance table_ - 1 - margin - e
      for (int64_t h = 0; h < H; ++h) {
        auto position = [&](int64_t e) {
          const int64_t d = table_ - 1 - kTableMargin - e;
          return d >= 0 && d < a_.rel_size ? a_.rel + (d * H + h) * dh : nullptr;
        };
        PackColumns(position, dh, table_, i * 16, r_ + h * dh * table_);
      }
      continue;
    }
    i -= table_items;  // queries plus each bias; padding rows zero
    for (int64_t r = i * kBlock; r < (i + 1) * kBlock; ++r) {
      for (int64_t h = 0; h < H; ++h) {
        uint16_t* qu = qu_ + (h * rows_ + r) * dh;
        uint16_t* qv = qv_ + (h * rows_ + r) * dh;
        if (r < a_.n) {
          const float* q = a_.q + r * a_.q_stride + h * dh;
          RoundRow(q, a_.u + h * dh, dh, qu);
          RoundRow(q, a_.v + h * dh, dh, qv);
        } else {
          std::fill(qu, qu + dh, 0);
          std::fill(qv, qv + dh, 0);
        }
      }
    }
  }
}

TXL_AVX512 void PrefillAttention::Run(int64_t begin, int64_t end) const {
  if (begin >= end) return;
  const int64_t dh = a_.dh, m = a_.held, M = a_.window;
  // A block's keys: its windows (at most M + 15 keys), widened to whole
  // 32-key steps on both sides.
  const int64_t width = std::min(keys_, RoundUp(kBlock + M - 1, 32) + 64);
  const int64_t ld = width + kBlock;  // score and position rows (the latter 16 wider)
  thread_local std::vector<float> scores, positions;
  thread_local std::vector<uint16_t> probs;
  scores.resize(kBlock * ld);
  positions.resize(kBlock * ld);
  probs.resize(kBlock * width);
  alignas(64) float sums[kBlock][64];
  const int64_t v_bytes = dh * 4, p_bytes = width * 2;
  const AmxTiles tiles;
  for (int64_t unit = begin; unit < end; ++unit) {
    const int64_t h = unit / blocks_, i0 = unit % blocks_ * kBlock;
    const int64_t rows = std::min(kBlock, a_.n - i0);
    const int64_t first = std::max<int64_t>(0, m + i0 - M + 1), stop = m + i0 + rows;
    const int64_t js = first / 32 * 32, kw = std::min(keys_, RoundUp(stop, 32)) - js;
    // Content scores: (q + u) [16, dh] x keys [dh, 16 keys], per 16 keys.
    RowProducts(qu_ + (h * rows_ + i0) * dh, dh, k_ + h * dh * keys_ + js * 2, keys_, kw, scores.data(), ld);
    // Position scores by t = j - i' (key j, query row i'), 16 wider than the
    // keys: position[i'][t - (js - 16)] = (q + v)_i' . r at distance m + i0 - t.
    const int64_t e0 = (table_ - 1 - kTableMargin) - (m + i0) + (js - 16);
    RowProducts(qv_ + (h * rows_ + i0) * dh, dh, r_ + h * dh * table_ + e0 * 2, table_, kw + 16, positions.data(), ld);
    // Softmax of each query's window, as bfloat16 probabilities (zero
    // outside the window and in padding rows).
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t last = m + i0 + r, lo = std::max<int64_t>(0, last - M + 1), hi = last + 1;
      float* s = scores.data() + r * ld - js;                      // by key j
      const float* g = positions.data() + r * ld - (js - 16) - r;  // by key j
      uint16_t* p = probs.data() + r * width - js;
      std::fill(p + js, p + lo, 0);
      std::fill(p + hi, p + js + kw, 0);
      float max = -std::numeric_limits<float>::infinity();
      int64_t j = lo;
      V16 m16 = V16{} + max;
      for (; j + 16 <= hi; j += 16) {
        const V16 x = (Load16(s + j) + Load16(g + j)) * a_.scale;
        std::memcpy(s + j, &x, sizeof(x));
        m16 = x > m16 ? x : m16;
      }
      for (int l = 0; l < 16; ++l) max = std::max(max, m16[l]);
      for (; j < hi; ++j) {
        s[j] = (s[j] + g[j]) * a_.scale;
        max = std::max(max, s[j]);
      }
      V16 sum16 = {};
      float sum = 0;
      for (j = lo; j + 16 <= hi; j += 16) {
        const V16 e = Exp(Load16(s + j) - max);
        std::memcpy(s + j, &e, sizeof(e));
        sum16 += e;
      }
      for (; j < hi; ++j) {
        s[j] = std::exp(s[j] - max);
        sum += s[j];
      }
      const float inv = 1.0f / (SumLanes(sum16) + sum);
      for (j = lo; j + 16 <= hi; j += 16) {
        const U16x16 bits = RoundBf16x16(Load16(s + j) * inv);
        std::memcpy(p + j, &bits, sizeof(bits));
      }
      for (; j < hi; ++j) p[j] = RoundBf16(s[j] * inv);
    }
    std::fill(probs.begin() + rows * width, probs.begin() + kBlock * width, 0);
    // Sums of values: tmm0..3 += probabilities [16, 32 keys] x values
    // [32 keys, 16 columns], per 32 keys.
    const uint16_t* vh = v_ + h * dh * keys_;
    asm volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::: "memory");
    for (int64_t ks = 0; ks < kw; ks += 32) {
      const uint16_t* vb = vh + (js + ks) / 2 * dh * 2;
      asm volatile(
          "tileloadd (%0,%1,1), %%tmm4\n\t"
          "tileloadd (%2,%3,1), %%tmm5\n\t"
          "tdpbf16ps %%tmm5, %%tmm4, %%tmm0\n\t"
          "tileloadd (%4,%3,1), %%tmm6\n\t"
          "tdpbf16ps %%tmm6, %%tmm4, %%tmm1" ::"r"(probs.data() + ks),
          "r"(p_bytes), "r"(vb), "r"(v_bytes), "r"(vb + 32)
          : "memory");
      if (dh == 64) {
        asm volatile(
            "tileloadd (%0,%1,1), %%tmm5\n\t"
            "tdpbf16ps %%tmm5, %%tmm4, %%tmm2\n\t"
            "tileloadd (%2,%1,1), %%tmm6\n\t"
            "tdpbf16ps %%tmm6, %%tmm4, %%tmm3" ::"r"(vb + 64),
            "r"(v_bytes), "r"(vb + 96)
            : "memory");
      }
    }
    const int64_t o_bytes = sizeof(sums[0]);
    asm volatile(
        "tilestored %%tmm0, (%0,%1,1)\n\t"
        "tilestored %%tmm1, (%2,%1,1)" ::"r"(&sums[0][0]),
        "r"(o_bytes), "r"(&sums[0][16])
        : "memory");
    if (dh == 64) {
      asm volatile(
          "tilestored %%tmm2, (%0,%1,1)\n\t"
          "tilestored %%tmm3, (%2,%1,1)" ::"r"(&sums[0][32]),
          "r"(o_bytes), "r"(&sums[0][48])
          : "memory");
    }
    for (int64_t r = 0; r < rows; ++r) std::memcpy(a_.out + (i0 + r) * a_.out_stride + h * dh, sums[r], dh * 4);
  }
}

}  // namespace txl
