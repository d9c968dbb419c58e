// SplitDecodeAttention's CPU form (model/kernels/split_decode_attention.h),
// whose per-key arithmetic and combination the CUDA kernels share, against
// the definition: one query per session over its window of pool rows.
#include "model/kernels/split_decode_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace txl {
namespace {

struct Case {
  std::vector<int64_t> held, window;
  at::ScalarType kv = at::kFloat;
  int64_t first_call_items = -1;  // run as two calls, split here (-1: one call)
};

void Check(const Case& c) {
  at::manual_seed(3);
  const int64_t B = static_cast<int64_t>(c.held.size()), H = 3, dh = 41;
  const int64_t most = *std::max_element(c.held.begin(), c.held.end()) + 1;
  const int64_t keys = (most + 127) / 128 * 128;  // padded as a decode bucket pads
  int64_t used = 0;
  for (int64_t m : c.held) used += m + 1;
  const int64_t pool_rows = used + 7;
  const at::Tensor pool_k = at::randn({pool_rows, H, dh}).to(c.kv), pool_v = at::randn({pool_rows, H, dh}).to(c.kv);
  pool_k[0].zero_();  // the padding row
  pool_v[0].zero_();
  // Each session's keys in scattered rows (never row 0), padding reads row 0.
  const at::Tensor order = at::randperm(pool_rows - 1, at::kLong) + 1;
  std::vector<int64_t> rows(B * keys, 0);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j <= c.held[b]; ++j) rows[b * keys + j] = order[next++].item<int64_t>();
  const at::Tensor q = at::randn({B, 3, H, dh}), u = at::randn({H, dh}), v = at::randn({H, dh});
  const at::Tensor rel = at::randn({keys, H, dh});
  const float scale = 0.156f;

  SplitDecodeArgs a;
  a.sessions = B;
  a.heads = H;
  a.dh = dh;
  a.keys = keys;
  a.q = q.data_ptr<float>();
  a.q_stride = 3 * H * dh;
  a.u = u.data_ptr<float>();
  a.v = v.data_ptr<float>();
  a.pool_keys = pool_k.data_ptr();
  a.pool_values = pool_v.data_ptr();
  a.kv_bf16 = c.kv == at::kBFloat16;
  a.rows = rows.data();
  a.held = c.held.data();
  a.window = c.window.data();
  a.rel = rel.data_ptr<float>();
  a.rel_size = keys;
  a.scale = scale;
  at::Tensor partial = at::full({B, H, a.Chunks(), dh + 2}, 7.0f);  // stale values must not leak
  at::Tensor out = at::full({B, H * dh}, 7.0f);
  a.partial = partial.data_ptr<float>();
  a.out = out.data_ptr<float>();
  a.out_stride = H * dh;
  if (c.first_call_items < 0) {
    SplitDecodeAttentionCpu(a, 0, B * H);
  } else {
    SplitDecodeAttentionCpu(a, c.first_call_items, B * H);
    SplitDecodeAttentionCpu(a, 0, c.first_call_items);
  }

  const at::Tensor kf = pool_k.to(at::kFloat), vf = pool_v.to(at::kFloat);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t m = c.held[b], lo = std::max<int64_t>(0, m - c.window[b] + 1);
    std::vector<int64_t> attended(rows.begin() + b * keys + lo, rows.begin() + b * keys + m + 1);
    const at::Tensor idx = at::tensor(attended, at::kLong);
    const at::Tensor dist = at::arange(m - lo, -1, -1, at::kLong);
    for (int64_t h = 0; h < H; ++h) {
      const at::Tensor qh = q[b][0][h];
      const at::Tensor s = (kf.index_select(0, idx).select(1, h).matmul(qh + u[h]) +
                            rel.index_select(0, dist).select(1, h).matmul(qh + v[h])) *
                           scale;
      const at::Tensor want = at::softmax(s, 0).matmul(vf.index_select(0, idx).select(1, h));
      const at::Tensor got = out[b].slice(0, h * dh, (h + 1) * dh);
      EXPECT_LT((got - want).abs().max().item<float>(), 2e-5) << "session " << b << " head " << h;
    }
  }
}

TEST(SplitDecodeAttentionTest, MatchesTheDefinitionAcrossChunksAndWindows) {
  // A first token (window of one), keys over two chunks, a window that leaves
  // the first chunks wholly masked, and a window wider than the keys.
  Check({{0, 70, 200, 150}, {1, 71, 5, 300}});
}

TEST(SplitDecodeAttentionTest, ReadsBfloat16Memories) { Check({{0, 70, 200, 150}, {1, 71, 5, 300}, at::kBFloat16}); }

TEST(SplitDecodeAttentionTest, ItemsSplitAcrossCallsEachWriteTheirOwn) {
  // Callers split the (session, head) items across threads; keys end at a
  // chunk's last key, its next chunk's first, and one past.
  Check({{63, 64, 65}, {64, 65, 66}, at::kFloat, 4});
}

}  // namespace
}  // namespace txl
