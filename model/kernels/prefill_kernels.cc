#include "model/kernels/prefill_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "model/kernels/simd.h"

namespace txl {
namespace {

using namespace simd;  // NOLINT: the vector helpers are this file's vocabulary

// One row: scores into `s` (float), then the softmax into the output row.
template <typename T, typename P, int kIsa>
__attribute__((always_inline)) inline void Row(const ScoreSoftmaxArgs& a, int64_t r, float* s) {
  const int64_t b = r / (a.heads * a.N), i = r % a.N;
  P* out = static_cast<P*>(a.prob) + r * a.K;
  std::memset(static_cast<void*>(out), 0, a.K * sizeof(P));
  if (i >= a.fed[b]) return;                  // padding: dropped by the caller
  const int64_t m = a.held[b], last = m + i;  // the query's own key
  const int64_t lo = std::max<int64_t>(0, last - a.window[b] + 1), hi = last + 1;
  const T* ac = static_cast<const T*>(a.ac) + r * a.K;
  const T* bd = static_cast<const T*>(a.bd) + r * a.D;
  const V8 scale = {a.scale, a.scale, a.scale, a.scale, a.scale, a.scale, a.scale, a.scale};
  float max = -std::numeric_limits<float>::infinity();
  int64_t j = lo;
  {
    V8 m8 = {max, max, max, max, max, max, max, max};
    for (; j + 8 <= hi; j += 8) {
      // Distances last - j .. last - j - 7: eight consecutive bd entries, reversed.
      const V8 d = LoadAs<V8, T, kIsa>(bd + (last - j - 7));
      const V8 v = (LoadAs<V8, T, kIsa>(ac + j) + __builtin_shufflevector(d, d, 7, 6, 5, 4, 3, 2, 1, 0)) * scale;
      std::memcpy(s + j, &v, sizeof(v));
      m8 = v > m8 ? v : m8;
    }
    for (int l = 0; l < 8; ++l) max = std::max(max, m8[l]);
  }
  for (; j < hi; ++j) {
    s[j] = (ToFloat(ac[j]) + ToFloat(bd[last - j])) * a.scale;
    max = std::max(max, s[j]);
  }
  const V8 max8 = {max, max, max, max, max, max, max, max};
  V8 sum8 = {};
  float sum = 0;
  j = lo;
  for (; j + 8 <= hi; j += 8) {
    const V8 e = Exp8(Load8(s + j) - max8);
    std::memcpy(s + j, &e, sizeof(e));
    sum8 += e;
  }
  for (; j < hi; ++j) {
    s[j] = std::exp(s[j] - max);
    sum += s[j];
  }
  const float inv = 1.0f / (Sum8(sum8) + sum);
  const V8 inv8 = {inv, inv, inv, inv, inv, inv, inv, inv};
  for (j = lo; j + 8 <= hi; j += 8) {
    const V8 p = Load8(s + j) * inv8;
    if constexpr (std::is_same_v<P, float>) {
      std::memcpy(out + j, &p, sizeof(p));
    } else {
      const U16x8 bits = RoundBf16x8(p);
      std::memcpy(static_cast<void*>(out + j), &bits, sizeof(bits));
    }
  }
  for (; j < hi; ++j) {
    const float p = s[j] * inv;
    if constexpr (std::is_same_v<P, float>) {
      out[j] = p;
    } else {
      out[j].bits = RoundBf16(p);
    }
  }
}

template <typename T, typename P, int kIsa>
__attribute__((always_inline)) inline void Rows(const ScoreSoftmaxArgs& a, int64_t begin, int64_t end) {
  std::vector<float> s(a.K);
  for (int64_t r = begin; r < end; ++r) Row<T, P, kIsa>(a, r, s.data());
}

template <typename T, typename P>
struct RowsKernel {
  template <int kBits>
  __attribute__((always_inline)) static void Run(const ScoreSoftmaxArgs& a, int64_t b, int64_t e) {
    Rows<T, P, kBits>(a, b, e);
  }
};

}  // namespace

void ScoreSoftmax(const ScoreSoftmaxArgs& a, int64_t begin, int64_t end, KernelIsa isa) {
  // Eight-lane rows: AVX-512 runs the AVX2 body.
  if (ResolveIsa(isa) == KernelIsa::kAvx512) isa = KernelIsa::kAvx2;
  const bool in16 = a.elem == Elem::kBf16, out16 = a.prob_elem == Elem::kBf16;
  if (in16 && out16) return DispatchIsa<RowsKernel<Bf16, Bf16>>(isa, a, begin, end);
  if (in16) return DispatchIsa<RowsKernel<Bf16, float>>(isa, a, begin, end);
  if (out16) return DispatchIsa<RowsKernel<float, Bf16>>(isa, a, begin, end);
  DispatchIsa<RowsKernel<float, float>>(isa, a, begin, end);
}

}  // namespace txl
