// The fused bfloat16 prefill attention on AMX (model/kernels/prefill_attention.h)
// against the same arithmetic in tensor ops: operands rounded to bfloat16,
// scores, softmax and sums in float32, probabilities rounded to bfloat16.
#include "model/kernels/prefill_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace txl {
namespace {

at::Tensor Rounded(const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); }

// out [n, H * dh] by the definition, one query at a time.
at::Tensor Reference(const at::Tensor& q, const at::Tensor& u, const at::Tensor& v, const at::Tensor& keys,
                     const at::Tensor& values, const at::Tensor& rel, int64_t held, int64_t window, float scale) {
  const int64_t n = q.size(0), H = u.size(0), dh = u.size(1);
  at::Tensor out = at::zeros({n, H * dh});
  for (int64_t h = 0; h < H; ++h) {
    const at::Tensor qh = q.slice(1, h * dh, (h + 1) * dh);
    const at::Tensor qu = Rounded(qh + u[h]), qv = Rounded(qh + v[h]);
    const at::Tensor kh = Rounded(keys.slice(1, h * dh, (h + 1) * dh));
    const at::Tensor vh = Rounded(values.slice(1, h * dh, (h + 1) * dh));
    const at::Tensor rh = Rounded(rel.select(1, h));  // [rel_size, dh]
    for (int64_t i = 0; i < n; ++i) {
      const int64_t last = held + i, lo = std::max<int64_t>(0, last - window + 1);
      const at::Tensor dist = at::arange(last - lo, -1, -1, at::kLong);  // distances of keys lo..last
      const at::Tensor s = (kh.slice(0, lo, last + 1).matmul(qu[i]) + rh.index_select(0, dist).matmul(qv[i])) * scale;
      const at::Tensor p = Rounded(at::softmax(s, 0));
      out[i].slice(0, h * dh, (h + 1) * dh).copy_(p.matmul(vh.slice(0, lo, last + 1)));
    }
  }
  return out;
}

// Query blocks (16) with and without a remainder, windows narrower and wider
// than the keys, held keys or none, both head sizes; run as two threads
// would split the work.
TEST(PrefillAttentionTest, MatchesTheRoundedArithmetic) {
  for (int64_t dh : {32, 64}) {
    if (!PrefillAttentionRuns(dh)) GTEST_SKIP() << "no AMX on this CPU: the tensor-op path serves every prefill";
  }
  at::manual_seed(21);
  const int64_t H = 3;
  PrefillAttentionBuffers buffers;  // reused, as the model reuses them: stale contents must not matter
  for (int64_t dh : {32, 64}) {
    for (int64_t n : {1, 16, 17, 45}) {
      for (int64_t held : {0, 7, 50}) {
        for (int64_t window : {4, 20, 64, 1000}) {
          const int64_t total = held + n, rel_size = std::min(total, window);
          const at::Tensor q = at::randn({n, 3 * H * dh});  // q in the first H * dh columns, as in qkv rows
          const at::Tensor u = at::randn({H, dh}) * 0.1, v = at::randn({H, dh}) * 0.1;
          const at::Tensor keys = at::randn({total, H * dh}), values = at::randn({total, H * dh});
          const at::Tensor rel = at::randn({rel_size, H, dh});
          const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
          at::Tensor out = at::full({n, H * dh}, 1e9);
          PrefillAttentionArgs a;
          a.heads = H;
          a.dh = dh;
          a.n = n;
          a.held = held;
          a.window = window;
          a.q = q.data_ptr<float>();
          a.q_stride = 3 * H * dh;
          a.u = u.data_ptr<float>();
          a.v = v.data_ptr<float>();
          a.keys = keys.data_ptr<float>();
          a.values = values.data_ptr<float>();
          a.kv_stride = H * dh;
          a.rel = rel.data_ptr<float>();
          a.rel_size = rel_size;
          a.scale = scale;
          a.out = out.data_ptr<float>();
          a.out_stride = H * dh;
          PrefillAttention attention(a, &buffers);
          const int64_t items = attention.pack_items();
          attention.Pack(items / 3, items);
          attention.Pack(0, items / 3);
          const int64_t half = attention.units() / 2;
          attention.Run(half, attention.units());
          attention.Run(0, half);
          const at::Tensor want = Reference(q.slice(1, 0, H * dh), u, v, keys, values, rel, held, window, scale);
          EXPECT_LT((out - want).abs().max().item<double>(), 1e-3)
              << "dh " << dh << " n " << n << " held " << held << " window " << window;
        }
      }
    }
  }
}

}  // namespace
}  // namespace txl
