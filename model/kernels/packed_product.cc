// The packed products declared in decode_kernels.h (PackPanels,
// PackedProduct): a few input rows (a step of several sessions, a prefill's
// rows on AMX or AVX-512-BF16) against weights packed in panels, each
// streamed once and reused from cache for every row.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "model/kernels/amx_product.h"
#include "model/kernels/decode_kernels.h"
#include "model/kernels/simd.h"

namespace txl {

namespace {

using namespace simd;  // NOLINT: the vector helpers are this file's vocabulary

static_assert(kPanel == kAmxPanel, "AMX products read the same panels");

// ---- Packed products. A tile is R input rows x NV vectors of W lanes; its
// R * NV accumulators stay in registers over the whole dot product (AVX-512:
// 7 x 4 zmm, AVX2: 6 x 2 ymm over each quarter of a panel). T: the packed
// weights' element type; int8 sums are scaled per output row at the end.

// Rows of x rounded to bfloat16 values (kept as floats), or copied when not
// rounded; each padded to `even` columns with zeros.
inline void PadRows(const float* x, int64_t batch, int64_t cols, int64_t even, bool round, float* out) {
  for (int64_t m = 0; m < batch; ++m) {
    const float* in = x + m * cols;
    float* row = out + m * even;
    int64_t c = 0;
    if (round) {
      for (; c + 8 <= cols; c += 8) {
        const U32x8 bits = __builtin_convertvector(RoundBf16x8(Load8(in + c)), U32x8) << 16;
        std::memcpy(row + c, &bits, sizeof(bits));
      }
      for (; c < cols; ++c) row[c] = ToFloat(Bf16{RoundBf16(in[c])});
    } else {
      std::memcpy(row, in, cols * sizeof(float));
      c = cols;
    }
    std::fill(row + c, row + even, 0.0f);
  }
}

// The output of a tile: scaled (int8), biased, rectified, the valid columns.
template <typename V, typename T, int W, int NV, int R>
__attribute__((always_inline)) inline void StoreTile(const V (&acc)[R][NV], float* y, int64_t ldy, int64_t valid,
                                                     const float* bias, const float* scale, bool relu) {
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < NV; ++j) {
      for (int lane = 0; lane < W && j * W + lane < valid; ++lane) {
        const int64_t col = j * W + lane;
        float out = acc[i][j][lane];
        if constexpr (std::is_same_v<T, int8_t>) out *= scale[col];
        if (bias) out += bias[col];
        y[i * ldy + col] = relu && out < 0 ? 0.0f : out;
      }
    }
  }
}

// Fetches this step's share of the next panel's lines.
__attribute__((always_inline)) inline void FetchShare(const char* prefetch, int64_t per_step, int64_t lines,
                                                      int64_t& line) {
  for (int64_t q = 0; q < per_step && line < lines; ++q, ++line) __builtin_prefetch(prefetch + 64 * line);
}

template <typename V, typename T, int kIsa, int W, int NV, int R>
__attribute__((always_inline)) inline void Tile(const T* panel, int64_t cols, const float* x, int64_t ldx, float* y,
                                                int64_t ldy, int64_t valid, const float* bias, const float* scale,
                                                bool relu, const char* prefetch, int64_t lines) {
  V acc[R][NV] = {};
  const int64_t per_k = (lines + cols - 1) / cols;
  int64_t line = 0;
  for (int64_t k = 0; k < cols; ++k) {
    FetchShare(prefetch, per_k, lines, line);
    V w[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) w[j] = LoadAs<V, T, kIsa>(panel + k * kPanel + j * W);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const float xs = x[i * ldx + k];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] += w[j] * xs;
    }
  }
  StoreTile<V, T, W, NV, R>(acc, y, ldy, valid, bias, scale, relu);
}

// The tile of a bfloat16 panel of column pairs: `pairs` of them; x has
// 2 * pairs columns per row (ldx), padded with zeros. Each load splits into
// the even and the odd column, and the even product is added first, as AMX's
// tdpbf16ps is specified to (amx_product.h).
template <typename V, int kIsa, int W, int NV, int R>
__attribute__((always_inline)) inline void PairTile(const Bf16* panel, int64_t pairs, const float* x, int64_t ldx,
                                                    float* y, int64_t ldy, int64_t valid, const float* bias, bool relu,
                                                    const char* prefetch, int64_t lines) {
  V acc[R][NV] = {};
  const int64_t per_k = (lines + pairs - 1) / pairs;
  int64_t line = 0;
  for (int64_t k = 0; k < pairs; ++k) {
    FetchShare(prefetch, per_k, lines, line);
    const Bf16* w = panel + 2 * k * kPanel;
    V even[NV], odd[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) SplitBf16(w + 2 * j * W, &even[j], &odd[j]);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const float xe = x[i * ldx + 2 * k], xo = x[i * ldx + 2 * k + 1];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        acc[i][j] += even[j] * xe;
        acc[i][j] += odd[j] * xo;
      }
    }
  }
  StoreTile<V, Bf16, W, NV, R>(acc, y, ldy, valid, bias, nullptr, relu);
}

#if !defined(__clang__)
// PairTile with VDPBF16PS (kBitsAvx512Bf16): x as bfloat16 pairs, `pairs`
// per row (ldx), one dot product per weight vector and row where the split
// took two products and two broadcasts. The sums' order differs (odd
// first), each product still exact.
template <int R>
__attribute__((always_inline)) inline void DotPairTile(const Bf16* panel, int64_t pairs, const uint32_t* x, int64_t ldx,
                                                       float* y, int64_t ldy, int64_t valid, const float* bias,
                                                       bool relu, const char* prefetch, int64_t lines) {
  constexpr int W = 16, NV = 4;
  V16 acc[R][NV] = {};
  const int64_t per_k = (lines + pairs - 1) / pairs;
  int64_t line = 0;
  for (int64_t k = 0; k < pairs; ++k) {
    FetchShare(prefetch, per_k, lines, line);
    const Bf16* w = panel + 2 * k * kPanel;
    V16 wv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) std::memcpy(&wv[j], w + 2 * j * W, sizeof(V16));
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const uint32_t xi = x[i * ldx + k];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = DotBf16Pairs(acc[i][j], wv[j], xi);
    }
  }
  StoreTile<V16, Bf16, W, NV, R>(acc, y, ldy, valid, bias, nullptr, relu);
}

// x's rows as bfloat16 pairs (even column in the low half), `pairs` per
// row, padded with zeros.
inline void PairRows(const float* x, int64_t batch, int64_t cols, int64_t pairs, uint32_t* out) {
  for (int64_t m = 0; m < batch; ++m) {
    const float* in = x + m * cols;
    uint32_t* row = out + m * pairs;
    for (int64_t k = 0; k < pairs; ++k) {
      const uint32_t lo = 2 * k < cols ? RoundBf16(in[2 * k]) : 0;
      const uint32_t hi = 2 * k + 1 < cols ? RoundBf16(in[2 * k + 1]) : 0;
      row[k] = lo | hi << 16;
    }
  }
}
#endif

// int8 products quantize x in blocks of this many columns, each with its
// own scale: one per row let a single large activation (a ReLU's output
// feeding ff2) coarsen the whole row, and a step of several sessions then
// moved log-probabilities by up to 0.08 from each session stepped alone.
constexpr int64_t kQuantBlock = 32;
constexpr int64_t kBlockQuads = kQuantBlock / 4;

#if !defined(__clang__)
// The tile of an int8 panel of column quads with VPDPBUSD
// (kBitsAvx512Vnni): x as signed bytes, `quads` words per row (ldx), its
// scales and offsets per block (ldb per row). Each block's sums are exact
// in int32; the weights are stored plus 128, so a block's sum holds 128
// times the sum of its x bytes (the offset), taken off before its scale:
// y = w_scale * sum over blocks of (sum - offset) * x_scale.
template <int R>
__attribute__((always_inline)) inline void QuadTile(const uint8_t* panel, int64_t quads, const uint32_t* x, int64_t ldx,
                                                    const float* x_scale, const int32_t* offset, int64_t ldb, float* y,
                                                    int64_t ldy, int64_t valid, const float* bias, const float* scale,
                                                    bool relu, const char* prefetch, int64_t lines) {
  constexpr int W = 16, NV = 4;
  V16 acc[R][NV] = {};
  const int64_t per_k = (lines + quads - 1) / quads;
  int64_t line = 0;
  for (int64_t k0 = 0, block = 0; k0 < quads; k0 += kBlockQuads, ++block) {
    I32x16 sums[R][NV] = {};
    for (int64_t k = k0; k < std::min(quads, k0 + kBlockQuads); ++k) {
      FetchShare(prefetch, per_k, lines, line);
      const uint8_t* w = panel + 4 * k * kPanel;
      I32x16 wv[NV];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) std::memcpy(&wv[j], w + 4 * j * W, sizeof(I32x16));
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) {
        const uint32_t xi = x[i * ldx + k];
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) sums[i][j] = DotU8S8Quads(sums[i][j], wv[j], xi);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const int32_t off = offset[i * ldb + block];
      const float xs = x_scale[i * ldb + block];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] += __builtin_convertvector(sums[i][j] - off, V16) * xs;
    }
  }
  StoreTile<V16, int8_t, W, NV, R>(acc, y, ldy, valid, bias, scale, relu);
}
#endif

// x's rows quantized for QuadTile: per block of kQuantBlock columns the
// scale max|x| / 127 (NaN where the block holds a NaN or an infinity, so
// that the outputs are NaN as float32 sums would make them), the bytes
// round(x / scale) in `quads` words per row (zeros past cols), and 128
// times the block's bytes summed; `blocks` per row.
inline void QuantizeRows(const float* x, int64_t batch, int64_t cols, int64_t quads, int64_t blocks, uint32_t* out,
                         float* x_scale, int32_t* offset) {
  for (int64_t m = 0; m < batch; ++m) {
    const float* in = x + m * cols;
    int8_t* bytes = reinterpret_cast<int8_t*>(out + m * quads);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kQuantBlock, c1 = std::min(cols, c0 + kQuantBlock),
                    c2 = std::min(4 * quads, c0 + kQuantBlock);
      float most = 0;
      bool finite = true;
      for (int64_t c = c0; c < c1; ++c) {
        finite = finite && std::isfinite(in[c]);
        most = std::max(most, std::fabs(in[c]));
      }
      const float inverse = finite && most > 0 ? 127.0f / most : 0.0f;
      int32_t sum = 0;
      for (int64_t c = c0; c < c2; ++c) {
        const int32_t q = c < c1 && finite ? static_cast<int32_t>(std::nearbyint(in[c] * inverse)) : 0;
        bytes[c] = static_cast<int8_t>(std::clamp(q, -127, 127));
        sum += bytes[c];
      }
      x_scale[m * blocks + b] = finite ? most / 127.0f : std::numeric_limits<float>::quiet_NaN();
      offset[m * blocks + b] = 128 * sum;
    }
  }
}

// Int8 quads where VPDPBUSD does not run (a narrower isa asked for, or a
// clang build): the same quantized x, the same exact integer sums per
// block, one product at a time; only the float sums of the blocks may
// round differently (a fused multiply-add there).
void QuadsByBytes(const PackedMatrix& pm, const float* x, int64_t batch, const float* bias, bool relu, float* y,
                  int64_t begin, int64_t end) {
  const int64_t stride = PanelStride(pm.cols, pm.elem), quads = stride / 4;
  const int64_t blocks = (quads + kBlockQuads - 1) / kBlockQuads;
  std::vector<uint32_t> xq(batch * quads);
  std::vector<float> x_scale(batch * blocks);
  std::vector<int32_t> offset(batch * blocks);
  QuantizeRows(x, batch, pm.cols, quads, blocks, xq.data(), x_scale.data(), offset.data());
  const uint8_t* packed = static_cast<const uint8_t*>(pm.data);
  for (int64_t p = begin; p < end; ++p) {
    const uint8_t* panel = packed + p * stride * kPanel;
    for (int64_t j = 0; j < kPanel && p * kPanel + j < pm.rows; ++j) {
      const int64_t r = p * kPanel + j;
      for (int64_t m = 0; m < batch; ++m) {
        const int8_t* xb = reinterpret_cast<const int8_t*>(xq.data() + m * quads);
        float acc = 0;
        for (int64_t b = 0; b < blocks; ++b) {
          int32_t sum = 0;
          for (int64_t k = b * kQuantBlock; k < std::min(stride, (b + 1) * kQuantBlock); ++k) {
            sum += panel[(k / 4 * kPanel + j) * 4 + k % 4] * xb[k];
          }
          acc += static_cast<float>(sum - offset[m * blocks + b]) * x_scale[m * blocks + b];
        }
        float out = acc * pm.scale[r];
        if (bias) out += bias[r];
        y[m * pm.rows + r] = relu && out < 0 ? 0.0f : out;
      }
    }
  }
}

// A panel's first tile streams it from memory, the others find it in cache;
// those others also fetch the next panel, a share each, so the memory keeps
// streaming while they compute.
template <typename V, typename T, int kIsa, int W, int NV>
__attribute__((always_inline)) inline void ProductBody(const PackedMatrix& pm, const float* x, int64_t batch,
                                                       const float* bias, bool relu, float* y, int64_t begin,
                                                       int64_t end) {
  constexpr bool kPairs = std::is_same_v<T, Bf16>;
  constexpr int kTile = W * NV;
  // Rows per tile: 7 x 4 accumulators + 4 weight vectors fill AVX-512's 32
  // registers (7 rows measured 7% faster than 6 at 32 sessions); AVX2 has
  // 16. Split pairs hold twice the weight vectors.
  constexpr int kRows = NV == 4 && !kPairs ? 7 : 6;
  const T* packed = static_cast<const T*>(pm.data);
  const int64_t rows = pm.rows, cols = pm.cols;
  const int64_t stride = PanelStride(cols, pm.elem);  // packed columns
  const int64_t panel_lines = stride * kPanel * static_cast<int64_t>(sizeof(T)) / 64;
  // Pairs read x padded to the packed columns, and rounded to bfloat16 with
  // bfloat16 products.
  constexpr bool kDot = kIsa == kBitsAvx512Bf16;
  static_assert(!kDot || kPairs, "the dot product is for bfloat16 pairs");
  constexpr bool kQuads = kIsa == kBitsAvx512Vnni;
  static_assert(!kQuads || std::is_same_v<T, int8_t>, "the byte dot product is for int8 quads");
  const float* xs = x;
  int64_t ldx = cols;
  [[maybe_unused]] const uint32_t* xp = nullptr;  // kDot: x as pairs; kQuads: as quads of bytes
  [[maybe_unused]] const float* x_scale = nullptr;
  [[maybe_unused]] const int32_t* x_offset = nullptr;
  [[maybe_unused]] int64_t blocks = 0;  // kQuads: x's scales per row
  if constexpr (kQuads) {
    thread_local std::vector<uint32_t> quads;
    thread_local std::vector<float> scales;
    thread_local std::vector<int32_t> offsets;
    ldx = stride / 4;
    blocks = (ldx + kBlockQuads - 1) / kBlockQuads;
    quads.resize(batch * ldx);
    scales.resize(batch * blocks);
    offsets.resize(batch * blocks);
    QuantizeRows(x, batch, cols, ldx, blocks, quads.data(), scales.data(), offsets.data());
    xp = quads.data();
    x_scale = scales.data();
    x_offset = offsets.data();
  } else if constexpr (kDot) {
    thread_local std::vector<uint32_t> pairs;
    ldx = stride / 2;
    pairs.resize(batch * ldx);
#if !defined(__clang__)
    PairRows(x, batch, cols, ldx, pairs.data());
#endif
    xp = pairs.data();
  } else if constexpr (kPairs) {
    thread_local std::vector<float> padded;
    ldx = stride;
    if (pm.bf16_products || stride != cols) {
      padded.resize(batch * stride);
      PadRows(x, batch, cols, stride, pm.bf16_products, padded.data());
      xs = padded.data();
    }
  }
  for (int64_t p = begin; p < end; ++p) {
    const T* panel = packed + p * stride * kPanel;
    const int64_t subs = std::min<int64_t>(kPanel, rows - p * kPanel + kTile - 1) / kTile;
    const int64_t units = subs * ((batch + kRows - 1) / kRows);
    const char* next = p + 1 < end ? reinterpret_cast<const char*>(panel + stride * kPanel) : nullptr;
    int64_t unit = 0;
    for (int64_t sub = 0; sub < subs * kTile; sub += kTile) {
      const int64_t r0 = p * kPanel + sub;
      const int64_t valid = std::min<int64_t>(kTile, rows - r0);
      const float* b = bias ? bias + r0 : nullptr;
      const float* sc = pm.scale ? pm.scale + r0 : nullptr;
      for (int64_t m = 0; m < batch; m += kRows, ++unit) {
        const float* xm = xs + m * ldx;
        float* ym = y + m * rows + r0;
        const char* pf = nullptr;
        int64_t lines = 0;
        if (next != nullptr && unit > 0) {
          const int64_t from = (unit - 1) * panel_lines / (units - 1), to = unit * panel_lines / (units - 1);
          pf = next + 64 * from;
          lines = to - from;
        }
        const T* ps = panel + (kPairs ? 2 * sub : kQuads ? 4 * sub : sub);
        auto tile = [&](auto rows_here) {
          constexpr int kR = decltype(rows_here)::value;
          if constexpr (kQuads) {
#if !defined(__clang__)
            QuadTile<kR>(reinterpret_cast<const uint8_t*>(ps), stride / 4, xp + m * ldx, ldx, x_scale + m * blocks,
                         x_offset + m * blocks, blocks, ym, rows, valid, b, sc, relu, pf, lines);
#endif
          } else if constexpr (kDot) {
#if !defined(__clang__)
            DotPairTile<kR>(ps, stride / 2, xp + m * ldx, ldx, ym, rows, valid, b, relu, pf, lines);
#endif
          } else if constexpr (kPairs) {
            PairTile<V, kIsa, W, NV, kR>(ps, stride / 2, xm, ldx, ym, rows, valid, b, relu, pf, lines);
          } else {
            Tile<V, T, kIsa, W, NV, kR>(ps, cols, xm, ldx, ym, rows, valid, b, sc, relu, pf, lines);
          }
        };
        switch (std::min<int64_t>(kRows, batch - m)) {
          case 7:
            if constexpr (kRows >= 7) tile(std::integral_constant<int, 7>());
            break;
          case 6: tile(std::integral_constant<int, 6>()); break;
          case 5: tile(std::integral_constant<int, 5>()); break;
          case 4: tile(std::integral_constant<int, 4>()); break;
          case 3: tile(std::integral_constant<int, 3>()); break;
          case 2: tile(std::integral_constant<int, 2>()); break;
          default: tile(std::integral_constant<int, 1>()); break;
        }
      }
    }
  }
}

template <typename T>
struct ProductKernel {
  template <int kBits>
  __attribute__((always_inline)) static void Run(const PackedMatrix& w, const float* x, int64_t batch,
                                                 const float* bias, bool relu, float* y, int64_t b, int64_t e) {
    if constexpr (kBits >= 512) {
      ProductBody<V16, T, kBits, 16, 4>(w, x, batch, bias, relu, y, b, e);
    } else {
      ProductBody<V8, T, kBits, 8, 2>(w, x, batch, bias, relu, y, b, e);
    }
  }
};

}  // namespace

int64_t PackedSize(int64_t rows, int64_t cols, Elem elem) {
  return (rows + kPanel - 1) / kPanel * kPanel * PanelStride(cols, elem);
}

namespace {
// Panel p holds rows [p * kPanel, +kPanel) of w; element (row r, column k)
// at k * kPanel + j (j = r - p * kPanel), or in groups of G columns (pairs,
// quads) at (k / G * kPanel + j) * G + k % G. Rows and columns past the end
// are zero; `offset` is added to every element (int8 quads: 128, making the
// bytes unsigned).
template <typename T, int G>
void PackTyped(const WeightMatrix& w, int64_t rows, int64_t cols, Elem elem, int offset, void* out) {
  const T* src = static_cast<const T*>(w.data);
  T* packed = static_cast<T*>(out);
  const int64_t stride = PanelStride(cols, elem);
  for (int64_t p = 0; p * kPanel < rows; ++p) {
    T* panel = packed + p * stride * kPanel;
    for (int64_t k = 0; k < stride; ++k) {
      for (int64_t j = 0; j < kPanel; ++j) {
        const int64_t r = p * kPanel + j;
        const int64_t at = (k / G * kPanel + j) * G + k % G;
        const T v = r < rows && k < cols ? src[r * w.ld + k] : T{};
        if constexpr (std::is_same_v<T, int8_t>) {
          panel[at] = static_cast<T>(static_cast<uint8_t>(v + offset));
        } else {
          panel[at] = v;
        }
      }
    }
  }
}
}  // namespace

void PackPanels(const WeightMatrix& w, int64_t rows, int64_t cols, void* packed, bool int8_products) {
  switch (w.elem) {
    case Elem::kBf16: return PackTyped<Bf16, 2>(w, rows, cols, w.elem, 0, packed);
    case Elem::kI8:
      if (int8_products) return PackTyped<int8_t, 4>(w, rows, cols, w.elem, 128, packed);
      return PackTyped<int8_t, 1>(w, rows, cols, w.elem, 0, packed);
    default: return PackTyped<float, 1>(w, rows, cols, w.elem, 0, packed);
  }
}

void PackedProduct(const PackedMatrix& w, const float* x, int64_t batch, const float* bias, bool relu, float* y,
                   int64_t begin, int64_t end, KernelIsa isa) {
  switch (w.elem) {
    case Elem::kBf16:
      // bfloat16 products run on AMX tiles where AVX-512 is asked for and the CPU has them.
      if (w.bf16_products && ResolveIsa(isa) == KernelIsa::kAvx512 && CpuRunsAmx()) {
        return AmxProduct(static_cast<const uint16_t*>(w.data), w.rows, w.cols, PanelStride(w.cols, w.elem), x, batch,
                          bias, relu, y, begin, end);
      }
      // VDPBF16PS where the CPU has it and x is rounded anyway (bfloat16 products).
      if (w.bf16_products) return DispatchBf16Dot<ProductKernel<Bf16>>(isa, w, x, batch, bias, relu, y, begin, end);
      return DispatchIsa<ProductKernel<Bf16>>(isa, w, x, batch, bias, relu, y, begin, end);
    case Elem::kI8:
      if (w.int8_products) {
#if !defined(__clang__)
        if (CpuRunsInt8Dot(isa)) {
          return isa_internal::RunAvx512Vnni<ProductKernel<int8_t>>(w, x, batch, bias, relu, y, begin, end);
        }
#endif
        return QuadsByBytes(w, x, batch, bias, relu, y, begin, end);
      }
      return DispatchIsa<ProductKernel<int8_t>>(isa, w, x, batch, bias, relu, y, begin, end);
    default: return DispatchIsa<ProductKernel<float>>(isa, w, x, batch, bias, relu, y, begin, end);
  }
}

}  // namespace txl
