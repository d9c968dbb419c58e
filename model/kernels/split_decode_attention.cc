// SplitDecodeAttentionCpu: the CUDA kernels' steps, one (session, head) at a
// time, serially (split_decode_attention.h).
#include "model/kernels/split_decode_attention.h"

#include <algorithm>
#include <vector>

namespace txl {

void SplitDecodeAttentionCpu(const SplitDecodeArgs& a, int64_t begin, int64_t end) {
  std::vector<float> qu(a.dh), qv(a.dh), p(kSplitChunk);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / a.heads, h = item % a.heads;
    if (a.write_rows != nullptr)
      for (int64_t d = 0; d < a.dh; ++d) SplitDecodeWriteOwn(a, b, h, d);
    const int64_t q0 = b * a.q_stride + h * a.dh;
    for (int64_t d = 0; d < a.dh; ++d) {
      const float q = LoadAsFloat(a.q, a.q_bf16, q0 + d);
      qu[d] = q + a.u[h * a.dh + d];
      qv[d] = q + a.v[h * a.dh + d];
    }
    for (int64_t c = 0; c < a.Chunks(); ++c) {
      const int64_t j0 = c * kSplitChunk;
      float top = -INFINITY;
      for (int64_t t = 0; t < kSplitChunk; ++t) {
        p[t] = SplitDecodeAttends(a, b, j0 + t) ? SplitDecodeScore(a, qu.data(), qv.data(), b, h, j0 + t) : -INFINITY;
        top = std::max(top, p[t]);
      }
      float* out = a.Partial(b, h, c);
      out[0] = top;
      out[1] = 0;
      std::fill(out + 2, out + 2 + a.dh, 0.0f);
      if (top == -INFINITY) continue;
      for (int64_t t = 0; t < kSplitChunk; ++t) {
        if (p[t] == -INFINITY) continue;
        const float w = expf(p[t] - top);
        out[1] += w;
        for (int64_t d = 0; d < a.dh; ++d) out[2 + d] += w * SplitDecodeValue(a, b, h, j0 + t, d);
      }
    }
    for (int64_t d = 0; d < a.dh; ++d)
      StoreFromFloat(a.out, a.out_bf16, b * a.out_stride + h * a.dh + d, SplitDecodeCombine(a, b, h, d));
  }
}

}  // namespace txl
