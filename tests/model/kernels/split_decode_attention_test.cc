// SplitDecodeAttention's CPU form (model/kernels/split_decode_attention.h),
// whose per-key arithmetic and combination the CUDA kernels share, against
// the definition: one query per session over its window of pool rows.
#include "model/kernels/split_decode_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/net/cuda_launch.h"

namespace txl {
namespace {

struct Case {
  std::vector<int64_t> held, window;
  at::ScalarType kv = at::kFloat;
  int64_t first_call_items = -1;  // run as two calls, split here (-1: one call)
  bool writes = false;            // the kernel stores each query's own key and value (write_rows)
  bool narrow_table = false;      // the position table's values are bfloat16's (reduced weights round it)
};

// The arguments over these tensors: q [B, 3, H, dh], u and v [H, dh], the
// pools [rows, H, dh] (float32 or bfloat16), rel [distances, H, dh] (float32
// or bfloat16).
SplitDecodeArgs ArgsOver(const at::Tensor& q, const at::Tensor& u, const at::Tensor& v, const at::Tensor& pool_k,
                         const at::Tensor& pool_v, const at::Tensor& rel, int64_t keys) {
  SplitDecodeArgs a;
  a.sessions = q.size(0);
  a.heads = q.size(2);
  a.dh = q.size(3);
  a.keys = keys;
  a.q = q.data_ptr();
  a.q_stride = 3 * a.heads * a.dh;
  a.u = u.data_ptr<float>();
  a.v = v.data_ptr<float>();
  a.pool_keys = pool_k.data_ptr();
  a.pool_values = pool_v.data_ptr();
  a.kv_bf16 = pool_k.scalar_type() == at::kBFloat16;
  a.rel = rel.data_ptr();
  a.rel_bf16 = rel.scalar_type() == at::kBFloat16;
  a.rel_size = rel.size(0);
  return a;
}

// Random inputs for a Case, dh columns a head: each session's keys in
// scattered pool rows (never row 0, the padding row); each query's own key
// is its session's last row, which holds a stale (random) key until the
// kernel stores the new one.
struct Inputs {
  int64_t B = 0, H = 3, dh = 0, keys = 0;
  at::Tensor pool_k, pool_v, q, u, v, rel;
  std::vector<int64_t> rows, own;
};

Inputs MakeInputs(const Case& c, int64_t dh) {
  at::manual_seed(3);
  Inputs in;
  in.B = static_cast<int64_t>(c.held.size());
  in.dh = dh;
  const int64_t B = in.B, H = in.H;
  const int64_t most = *std::max_element(c.held.begin(), c.held.end()) + 1;
  in.keys = (most + 127) / 128 * 128;  // padded as a decode bucket pads
  int64_t used = 0;
  for (int64_t m : c.held) used += m + 1;
  const int64_t pool_rows = used + 7;
  in.pool_k = at::randn({pool_rows, H, dh}).to(c.kv);
  in.pool_v = at::randn({pool_rows, H, dh}).to(c.kv);
  in.pool_k[0].zero_();  // the padding row
  in.pool_v[0].zero_();
  const at::Tensor order = at::randperm(pool_rows - 1, at::kLong) + 1;
  in.rows.assign(B * in.keys, 0);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j <= c.held[b]; ++j) in.rows[b * in.keys + j] = order[next++].item<int64_t>();
  in.q = at::randn({B, 3, H, dh});
  in.u = at::randn({H, dh});
  in.v = at::randn({H, dh});
  in.rel = c.narrow_table ? at::randn({in.keys, H, dh}).to(at::kBFloat16).to(at::kFloat) : at::randn({in.keys, H, dh});
  for (int64_t b = 0; b < B; ++b) in.own.push_back(in.rows[b * in.keys + c.held[b]]);
  return in;
}

void Check(const Case& c) {
  const Inputs in = MakeInputs(c, 41);
  const int64_t B = in.B, H = in.H, dh = in.dh, keys = in.keys;
  const at::Tensor &pool_k = in.pool_k, &pool_v = in.pool_v, &q = in.q, &u = in.u, &v = in.v, &rel = in.rel;
  std::vector<int64_t> rows = in.rows, own = in.own;
  const float scale = 0.156f;

  SplitDecodeArgs a = ArgsOver(q, u, v, pool_k, pool_v, rel, keys);
  a.rows = rows.data();
  a.held = c.held.data();
  a.window = c.window.data();
  a.scale = scale;
  if (c.writes) a.write_rows = own.data();
  at::Tensor partial = at::full({B, H, a.Chunks(), dh + 2}, 7.0f);  // stale values must not leak
  at::Tensor out = at::full({B, H * dh}, 7.0f);
  a.partial = partial.data_ptr<float>();
  a.out = out.data_ptr();
  a.out_stride = H * dh;
  if (c.first_call_items < 0) {
    SplitDecodeAttentionCpu(a, 0, B * H);
  } else {
    SplitDecodeAttentionCpu(a, c.first_call_items, B * H);
    SplitDecodeAttentionCpu(a, 0, c.first_call_items);
  }

  // bfloat16 activations (IncrementalModel's bf16_stream_): a bfloat16
  // query is read as its float32 widening, and a bfloat16 result is the
  // float32 one rounded as torch rounds it, bit for bit.
  {
    const at::Tensor q16 = q.to(at::kBFloat16), widened = q16.to(at::kFloat);
    at::Tensor from_widened = at::empty({B, H * dh}), rounded = at::full({B, H * dh}, 7.0f).to(at::kBFloat16);
    SplitDecodeArgs f = a;
    f.write_rows = nullptr;  // both read what the call above stored
    f.q = widened.data_ptr();
    f.out = from_widened.data_ptr();
    SplitDecodeAttentionCpu(f, 0, B * H);
    SplitDecodeArgs n = f;
    n.q = q16.data_ptr();
    n.q_bf16 = true;
    n.out = rounded.data_ptr();
    n.out_bf16 = true;
    SplitDecodeAttentionCpu(n, 0, B * H);
    EXPECT_TRUE(at::equal(rounded, from_widened.to(at::kBFloat16)));
    EXPECT_GT((from_widened - out).abs().max().item<float>(), 0) << "the query's rounding changed nothing?";
    if (c.writes) {  // a bfloat16 projection's key and value stored, into copies of the pool
      const at::Tensor keys16 = pool_k.clone(), values16 = pool_v.clone();
      SplitDecodeArgs s = n;
      s.write_rows = own.data();
      s.pool_keys = keys16.data_ptr();
      s.pool_values = values16.data_ptr();
      SplitDecodeAttentionCpu(s, 0, B * H);
      for (int64_t b = 0; b < B; ++b) {
        EXPECT_TRUE(at::equal(keys16[own[b]], q16[b][1].to(c.kv))) << "session " << b << "'s bfloat16 key";
        EXPECT_TRUE(at::equal(values16[own[b]], q16[b][2].to(c.kv))) << "session " << b << "'s bfloat16 value";
      }
    }
  }

  // Where reduced weights round the table to bfloat16, the step reads it in
  // bfloat16 (rel_bf16): the same values, so the same result, bit for bit.
  if (c.narrow_table) {
    const at::Tensor rel16 = rel.to(at::kBFloat16);
    at::Tensor from16 = at::empty({B, H * dh});
    SplitDecodeArgs r = a;
    r.write_rows = nullptr;  // reads what the call above stored
    r.rel = rel16.data_ptr();
    r.rel_bf16 = true;
    r.out = from16.data_ptr();
    SplitDecodeAttentionCpu(r, 0, B * H);
    EXPECT_TRUE(at::equal(from16, out));
  }

  if (c.writes) {  // stored as torch converts them
    for (int64_t b = 0; b < B; ++b) {
      EXPECT_TRUE(at::equal(pool_k[own[b]], q[b][1].to(c.kv))) << "session " << b << "'s key";
      EXPECT_TRUE(at::equal(pool_v[own[b]], q[b][2].to(c.kv))) << "session " << b << "'s value";
    }
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

// The bfloat16 store against torch's conversion: random values, exact ties
// (to even, up and down), the largest floats, infinities, subnormals, and
// NaN (a NaN).
TEST(SplitDecodeAttentionTest, StoresBfloat16AsTorchRoundsIt) {
  at::manual_seed(5);
  std::vector<float> values = {1.00390625f, 1.01171875f, -1.00390625f, 3.4028235e38f, -3.4028235e38f, INFINITY,
                               -INFINITY,   1e-40f,      -1e-45f,      0.0f,          -0.0f,          NAN};
  const at::Tensor random = at::randn({1000}) * 1000;
  for (int64_t i = 0; i < random.numel(); ++i) values.push_back(random[i].item<float>());
  const at::Tensor want = at::tensor(values).to(at::kBFloat16);
  std::vector<uint16_t> got(values.size());
  for (size_t i = 0; i < values.size(); ++i) StoreFromFloat(got.data(), true, static_cast<int64_t>(i), values[i]);
  const uint16_t* w = static_cast<const uint16_t*>(want.data_ptr());
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) {  // a NaN, whose payload torch's paths choose differently (0x7fc0, 0xffff)
      EXPECT_EQ(got[i] & 0x7f80, 0x7f80);
      EXPECT_NE(got[i] & 0x007f, 0);
    } else {
      EXPECT_EQ(got[i], w[i]) << "value " << values[i];
    }
  }
}

TEST(SplitDecodeAttentionTest, ItemsSplitAcrossCallsEachWriteTheirOwn) {
  // Callers split the (session, head) items across threads; keys end at a
  // chunk's last key, its next chunk's first, and one past.
  Check({{63, 64, 65}, {64, 65, 66}, at::kFloat, 4});
}

// The decode step's form (IncrementalModel::SplitDecode): the kernel
// stores each query's key and value in its session's last row, then attends
// them with the rest, the first chunk's key, a later chunk's, and one in a
// chunk of its own.
TEST(SplitDecodeAttentionTest, StoresTheQuerysOwnKeyBeforeReadingIt) {
  Check({{0, 70, 200, 128}, {1, 71, 5, 300}, at::kFloat, -1, true});
  Check({{0, 70, 200, 128}, {1, 71, 5, 300}, at::kBFloat16, 5, true});
}

TEST(SplitDecodeAttentionTest, ReadsABfloat16PositionTable) {
  Check({{0, 70, 200, 150}, {1, 71, 5, 300}, at::kFloat, -1, false, true});
  Check({{0, 70, 200, 150}, {1, 71, 5, 300}, at::kBFloat16, -1, true, true});
}

// The CUDA kernel (model/cuda/split_decode_attention.cu) against the CPU
// form on the same inputs: its results within float32's reordering of the
// sums, and the same keys and values stored. The last session stands for a
// padding one: its write row is skip_row, which neither stores to.
// bf16_stream: a bfloat16 query and result (IncrementalModel's
// bf16_stream_), the result within one bfloat16 rounding. misaligned: the
// pools start one element past 16 bytes (the kernel's one-value loads).
void CheckCudaAgainstCpu(const Case& c, int64_t dh, bool bf16_stream, bool misaligned = false) {
  const Inputs in = MakeInputs(c, dh);
  const int64_t B = in.B, H = in.H;
  const at::Device cuda(at::kCUDA, 0);
  std::vector<int64_t> write = in.own;
  const int64_t skip = write.back();
  const at::Tensor q = bf16_stream ? in.q.to(at::kBFloat16) : in.q;
  const at::Tensor rel = c.narrow_table ? in.rel.to(at::kBFloat16) : in.rel;
  const at::ScalarType out_type = bf16_stream ? at::kBFloat16 : at::kFloat;
  const auto longs = [](const std::vector<int64_t>& x) { return at::tensor(x, at::kLong); };
  const at::Tensor held = longs(c.held), window = longs(c.window), rows = longs(in.rows), writes = longs(write);

  // The same arguments over tensors on `device`; the pools are copies, which
  // the call writes.
  struct Run {
    at::Tensor pool_k, pool_v, q, u, v, rel, rows, held, window, writes, partial, out, done;
  };
  const auto run = [&](const at::Device& device) {
    const auto copy = [&](const at::Tensor& pool) {
      const at::Tensor room = at::empty({pool.numel() + 1}, pool.options().device(device));
      return room.narrow(0, misaligned ? 1 : 0, pool.numel()).view(pool.sizes()).copy_(pool);
    };
    Run r;
    r.pool_k = copy(in.pool_k);
    r.pool_v = copy(in.pool_v);
    r.q = q.to(device);
    r.u = in.u.to(device);
    r.v = in.v.to(device);
    r.rel = rel.to(device);
    r.rows = rows.to(device);
    r.held = held.to(device);
    r.window = window.to(device);
    r.writes = writes.to(device);
    SplitDecodeArgs a = ArgsOver(r.q, r.u, r.v, r.pool_k, r.pool_v, r.rel, in.keys);
    a.q_bf16 = bf16_stream;
    a.rows = r.rows.data_ptr<int64_t>();
    a.held = r.held.data_ptr<int64_t>();
    a.window = r.window.data_ptr<int64_t>();
    a.write_rows = r.writes.data_ptr<int64_t>();
    a.skip_row = skip;
    a.scale = 0.156f;
    r.partial = at::full({B, H, a.Chunks(), in.dh + 2}, 7.0f, at::TensorOptions().device(device));
    r.out = at::full({B, H * in.dh}, 7.0f, at::TensorOptions().device(device)).to(out_type);
    r.done = at::zeros({B * H}, at::TensorOptions().dtype(at::kInt).device(device));
    a.partial = r.partial.data_ptr<float>();
    a.out = r.out.data_ptr();
    a.out_stride = H * in.dh;
    a.out_bf16 = bf16_stream;
    a.done = r.done.data_ptr<int>();
    if (device.is_cpu()) {
      SplitDecodeAttentionCpu(a, 0, B * H);
    } else {
      LaunchSplitDecodeAttention(a, device.index());
    }
    return r;
  };
  const Run want = run(at::Device(at::kCPU)), got = run(cuda);

  const at::Tensor diff = (got.out.cpu().to(at::kFloat) - want.out.to(at::kFloat)).abs();
  const at::Tensor bound = bf16_stream ? 8e-3 * want.out.to(at::kFloat).abs() + 1e-6 : at::full_like(diff, 1e-5);
  EXPECT_TRUE((diff <= bound).all().item<bool>()) << "dh " << dh << ": largest difference " << diff.max().item<float>();
  EXPECT_TRUE(at::equal(got.pool_k.cpu(), want.pool_k)) << "dh " << dh << ": the stored keys";
  EXPECT_TRUE(at::equal(got.pool_v.cpu(), want.pool_v)) << "dh " << dh << ": the stored values";
  EXPECT_TRUE(at::equal(want.pool_k[skip], in.pool_k[skip])) << "the skip row was written";
  EXPECT_TRUE((got.done.cpu() == (in.keys + kSplitChunk - 1) / kSplitChunk).all().item<bool>())
      << "every chunk counted itself off";
}

// On a GPU only (scripts/gpu_check.sh's unit step): elsewhere skipped.
TEST(SplitDecodeAttentionTest, TheCudaKernelMatchesTheCpuForm) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  // 16-byte loads (64; 96 and 48, whose vectors a row do not divide the
  // block's threads; 8, with fewer than 4 vectors a row; 36 and 20, four
  // bfloat16 values a load), one value a load (41; 258, over one row per
  // thread).
  for (const int64_t dh : {64, 96, 48, 8, 36, 20, 41, 258}) {
    for (const at::ScalarType kv : {at::kFloat, at::kBFloat16}) {
      for (const bool narrow : {false, true}) {
        // Two chunks' worth, a wholly masked first chunk, a first token, 14 chunks, and the padding session.
        const Case c{{70, 200, 0, 800, 5}, {71, 5, 1, 800, 6}, kv, -1, true, narrow};
        CheckCudaAgainstCpu(c, dh, false);
        CheckCudaAgainstCpu(c, dh, true);
        if (dh == 64) CheckCudaAgainstCpu(c, dh, false, true);
      }
    }
  }
}

// A padding session's write row is the pool's discard row (skip_row):
// nothing is stored there, so padding sessions on several threads do not
// race on it.
TEST(SplitDecodeAttentionTest, StoresNothingInTheSkipRow) {
  const int64_t H = 2, dh = 4, keys = 64;
  at::Tensor pool_k = at::zeros({3, H, dh}), pool_v = at::zeros({3, H, dh});
  const at::Tensor q = at::randn({2, 3, H, dh}), u = at::zeros({H, dh}), v = at::zeros({H, dh});
  const at::Tensor rel = at::zeros({keys, H, dh});
  std::vector<int64_t> rows(2 * keys, 0), held = {0, 0}, window = {1, 1}, write = {1, 2};
  at::Tensor partial = at::empty({2, H, 1, dh + 2}), out = at::empty({2, H * dh});
  SplitDecodeArgs a = ArgsOver(q, u, v, pool_k, pool_v, rel, keys);
  a.rows = rows.data();
  a.held = held.data();
  a.window = window.data();
  a.partial = partial.data_ptr<float>();
  a.out = out.data_ptr();
  a.out_stride = H * dh;
  a.write_rows = write.data();
  a.skip_row = 1;
  SplitDecodeAttentionCpu(a, 0, 2 * H);
  EXPECT_TRUE(at::equal(pool_k[1], at::zeros({H, dh})));
  EXPECT_TRUE(at::equal(pool_v[1], at::zeros({H, dh})));
  EXPECT_TRUE(at::equal(pool_k[2], q[1][1]));
  EXPECT_TRUE(at::equal(pool_v[2], q[1][2]));
}

}  // namespace
}  // namespace txl
