#include "model/kernels/amx_product.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "model/kernels/simd.h"

namespace txl {

namespace {

using simd::Bf16;
constexpr int64_t kPanel = kAmxPanel;

// Register use: tmm0-3 hold the sums of 16 x rows by the panel's 64
// columns (16 each), tmm4 the x block, tmm5 and tmm6 the weight blocks,
// alternately (amx_tiles.h: every tile 16 rows of 64 bytes).
constexpr int64_t kRows = 16, kDepth = 32;  // per block: x rows, and columns summed

// Rows of x as bfloat16 bits (rounded to nearest even), padded with zeros to
// `stride` columns, and with zero rows to a whole number of tiles.
TXL_AVX512 void BlocksOfX(const float* x, int64_t batch, int64_t cols, int64_t stride, std::vector<uint16_t>* out) {
  const int64_t padded_rows = (batch + kRows - 1) / kRows * kRows;
  out->resize(padded_rows * stride);
  for (int64_t m = 0; m < batch; ++m) {
    const float* in = x + m * cols;
    uint16_t* row = out->data() + m * stride;
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const simd::U16x8 b = simd::RoundBf16x8(simd::Load8(in + c));
      std::memcpy(row + c, &b, sizeof(b));
    }
    for (; c < cols; ++c) row[c] = simd::RoundBf16(in[c]);
    std::fill(row + cols, row + stride, 0);
  }
  std::fill(out->data() + batch * stride, out->data() + padded_rows * stride, 0);
}

// Rows [m0, m0 + n) of y, columns [r0, r0 + valid): the tiles' sums plus
// bias, rectified when relu.
TXL_AVX512 void Finish(const float (*sums)[kPanel], int64_t n, const float* bias, bool relu, int64_t valid, float* y,
                       int64_t ldy) {
  for (int64_t i = 0; i < n; ++i) {
    float* out = y + i * ldy;
    int64_t c = 0;
    for (; c + 16 <= valid; c += 16) {
      simd::V16 v;
      std::memcpy(&v, &sums[i][c], sizeof(v));
      if (bias) {
        simd::V16 b;
        std::memcpy(&b, bias + c, sizeof(b));
        v += b;
      }
      if (relu) v = v < 0 ? 0 : v;
      std::memcpy(out + c, &v, sizeof(v));
    }
    for (; c < valid; ++c) {
      const float v = bias ? sums[i][c] + bias[c] : sums[i][c];
      out[c] = relu && v < 0 ? 0.0f : v;
    }
  }
}

}  // namespace

void AmxProduct(const uint16_t* panels, int64_t rows, int64_t cols, int64_t stride, const float* x, int64_t batch,
                const float* bias, bool relu, float* y, int64_t begin, int64_t end) {
  thread_local std::vector<uint16_t> xb;
  BlocksOfX(x, batch, cols, stride, &xb);
  const AmxTiles tiles;
  const int64_t x_bytes = stride * 2, w_bytes = kPanel * 2 * 2;  // row strides
  alignas(64) float sums[kRows][kPanel];
  const Bf16* packed = reinterpret_cast<const Bf16*>(panels);
  for (int64_t p = begin; p < end; ++p) {
    const Bf16* panel = packed + p * stride * kPanel;
    const int64_t r0 = p * kPanel, valid = std::min<int64_t>(kPanel, rows - r0);
    for (int64_t m0 = 0; m0 < batch; m0 += kRows) {
      asm volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::: "memory");
      const uint16_t* xa = xb.data() + m0 * stride;
      for (int64_t k = 0; k < stride; k += kDepth) {
        // Weight block: pair rows k / 2 .. k / 2 + 15 of the panel, 16
        // columns (32 bfloat16) per tile, at kPanel pairs per row.
        const Bf16* wk = panel + k * kPanel;
        asm volatile(
            "tileloadd (%0,%1,1), %%tmm4\n\t"
            "tileloadd (%2,%3,1), %%tmm5\n\t"
            "tdpbf16ps %%tmm5, %%tmm4, %%tmm0\n\t"
            "tileloadd (%4,%3,1), %%tmm6\n\t"
            "tdpbf16ps %%tmm6, %%tmm4, %%tmm1\n\t"
            "tileloadd (%5,%3,1), %%tmm5\n\t"
            "tdpbf16ps %%tmm5, %%tmm4, %%tmm2\n\t"
            "tileloadd (%6,%3,1), %%tmm6\n\t"
            "tdpbf16ps %%tmm6, %%tmm4, %%tmm3" ::"r"(xa + k),
            "r"(x_bytes), "r"(wk), "r"(w_bytes), "r"(wk + 32), "r"(wk + 64), "r"(wk + 96)
            : "memory");
      }
      asm volatile(
          "tilestored %%tmm0, (%0,%1,1)\n\t"
          "tilestored %%tmm1, (%2,%1,1)\n\t"
          "tilestored %%tmm2, (%3,%1,1)\n\t"
          "tilestored %%tmm3, (%4,%1,1)" ::"r"(&sums[0][0]),
          "r"(static_cast<int64_t>(sizeof(sums[0]))), "r"(&sums[0][16]), "r"(&sums[0][32]), "r"(&sums[0][48])
          : "memory");
      Finish(sums, std::min(kRows, batch - m0), bias ? bias + r0 : nullptr, relu, valid, y + m0 * rows + r0, rows);
    }
  }
}

}  // namespace txl
