// Decode graphs on the CPU: with decode_graphs, the generic path pads each
// decode step to a DecodeBucket and runs it through the bucket's static
// metadata, eagerly (a GPU captures and replays the same pass). Every
// result must equal the unpadded pass's, across buckets, pool growth and
// sessions that cannot be padded.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "model/net/decode_buckets.h"
#include "model/net/incremental.h"
#include "tests/model/model_fixture.h"

namespace txl {
namespace {

using testing::FeedInChunks;
using testing::MaxAbsDiff;
using testing::RandomTokens;
using testing::Row;
using testing::TestWeights;

// graphs: decode graphs; pass_graphs: multi-token passes padded too (off
// for the decode graphs' own tests, whose prefills then match exactly).
IncrementalModel Generic(const ModelConfig& c, const TxlWeights& w, bool graphs, WeightDtype dtype, KvDtype kv,
                         bool split_decode_attention = true, bool short_feeds = true, bool pass_graphs = false) {
  IncrementalModel::Precision p;
  p.kernels = Kernels::kGeneric;
  p.decode_graphs = graphs;
  p.pass_graphs = pass_graphs;
  p.split_decode_attention = split_decode_attention;
  p.decode_short_feeds = short_feeds;
  p.dtype = dtype;
  p.kv_dtype = kv;
  return IncrementalModel(c, w, at::kCPU, p);
}

TEST(DecodeBucketTest, SessionsGoToPowersOfTwoAndKeysToMultiplesOf128) {
  const int64_t K = DecodeBucket::kKeyBucket;
  EXPECT_EQ(DecodeBucket::For(1, 1).sessions, 1);
  EXPECT_EQ(DecodeBucket::For(1, 1).keys, K);
  EXPECT_EQ(DecodeBucket::For(3, K).sessions, 4);
  EXPECT_EQ(DecodeBucket::For(3, K).keys, K);
  EXPECT_EQ(DecodeBucket::For(4, K + 1).keys, 2 * K);
  EXPECT_EQ(DecodeBucket::For(32, 800).sessions, 32);
  EXPECT_EQ(DecodeBucket::For(32, 800).keys, 896);
  EXPECT_EQ(DecodeBucket::For(33, 800).sessions, 64);
  EXPECT_TRUE(DecodeBucket::For(2, 10) < DecodeBucket::For(2, 200));
  EXPECT_FALSE(DecodeBucket::For(2, 200) < DecodeBucket::For(2, 10));
  EXPECT_EQ(DecodeBucket::For(2, 10).tokens, 1);
}

// A multi-token pass: tokens to the next power of two, keys to hold the most
// held positions plus every padded token.
TEST(DecodeBucketTest, PassesPadTheirTokensToPowersOfTwoAndKeepRoomForThem) {
  const int64_t K = DecodeBucket::kKeyBucket;
  const DecodeBucket scoring = DecodeBucket::ForPass(32, 64, 639);
  EXPECT_EQ(scoring.sessions, 32);
  EXPECT_EQ(scoring.tokens, 64);
  EXPECT_EQ(scoring.keys, 6 * K);  // 639 + 64 = 703
  EXPECT_EQ(DecodeBucket::ForPass(3, 5, 0).tokens, 8);
  EXPECT_EQ(DecodeBucket::ForPass(3, 5, 0).keys, K);
  EXPECT_EQ(DecodeBucket::ForPass(1, 2, K - 2).keys, K);
  EXPECT_EQ(DecodeBucket::ForPass(1, 2, K - 1).keys, 2 * K);
  EXPECT_TRUE(DecodeBucket::ForPass(2, 2, 10) < DecodeBucket::ForPass(2, 4, 10));
  EXPECT_TRUE(DecodeBucket::For(2, 10) < DecodeBucket::ForPass(2, 2, 9)) << "a decode bucket is not a pass's";
}

// Sessions of several windows (two shorter than a bucket, three that cross
// from the first key bucket into the second), decoded in changing subsets
// (1 to 5 sessions: buckets of 1, 2, 4 and 8), with the pool growing half
// way (captured passes hold its address). Both use the split decode
// attention; a third model, unpadded with the tensor-op attention, holds the
// split attention to it (the same rounded memories; with bfloat16 weights
// the tensor ops multiply in bfloat16, the split attention in float32, of
// the bfloat16 query).
TEST(DecodeGraphsTest, PaddedDecodeStepsEqualTheUnpaddedPass) {
  struct Mode {
    WeightDtype dtype;
    KvDtype kv;
    double tolerance, split_tolerance;
  };
  for (const Mode mode : {Mode{WeightDtype::kFloat32, KvDtype::kFloat32, 1e-5, 1e-5},
                          // (1.1e-5 against torch 2.11's products, 4.9e-6 against 1.13's;
                          // attending unrounded keys would differ by about 1e-3)
                          Mode{WeightDtype::kFloat32, KvDtype::kBfloat16, 1e-5, 1e-4},
                          Mode{WeightDtype::kBfloat16, KvDtype::kBfloat16, 1e-3, 0.05}}) {
    ModelConfig c = testing::SmallConfig();
    c.mem_len = 160;
    const TxlWeights w = TestWeights(c, 31);
    IncrementalModel plain = Generic(c, w, false, mode.dtype, mode.kv);
    IncrementalModel padded = Generic(c, w, true, mode.dtype, mode.kv);
    IncrementalModel tensor_ops = Generic(c, w, false, mode.dtype, mode.kv, false);
    const std::vector<int64_t> windows = {160, 5, 140, 2, 130};
    std::vector<SessionMemory> a, b, t;
    a.reserve(64);
    b.reserve(64);
    t.reserve(64);
    auto add = [&](int64_t window, int64_t prefill, uint32_t seed) {
      a.emplace_back(c.n_layer, window);
      b.emplace_back(c.n_layer, window);
      t.emplace_back(c.n_layer, window);
      const std::vector<int64_t> tokens = RandomTokens(prefill, c.n_token, seed);
      const StepInput ia = Row(&a.back(), tokens), ib = Row(&b.back(), tokens), it = Row(&t.back(), tokens);
      const at::Tensor ha = plain.Step(absl::MakeConstSpan(&ia, 1));
      EXPECT_LT(MaxAbsDiff(ha, padded.Step(absl::MakeConstSpan(&ib, 1))), mode.tolerance) << "a prefill is not padded";
      EXPECT_LT(MaxAbsDiff(ha, tensor_ops.Step(absl::MakeConstSpan(&it, 1))), mode.tolerance)
          << "a prefill takes the tensor ops in both";
    };
    for (size_t i = 0; i < windows.size(); ++i) add(windows[i], 100 + 7 * static_cast<int64_t>(i), 50 + i);
    const int64_t before = padded.graph_counts().padded;
    double worst = 0, worst_split = 0;
    for (int step = 0; step < 50; ++step) {
      if (step == 25) {
        const int64_t rows = padded.pool()->rows();
        for (int i = 0; i < 40; ++i) add(160, 60, 900 + i);
        EXPECT_GT(padded.pool()->rows(), rows) << "the pool grew";
      }
      std::vector<StepInput> ia, ib, it;
      for (size_t s = 0; s < a.size(); ++s) {
        const bool in = s < windows.size() ? (step + s) % 4 != 0 : s % 13 == static_cast<size_t>(step % 13);
        if (!in) continue;
        const int64_t token = (step * 7 + static_cast<int64_t>(s) * 5) % c.n_token;
        ia.push_back(Row(&a[s], {token}));
        ib.push_back(Row(&b[s], {token}));
        it.push_back(Row(&t[s], {token}));
      }
      const at::Tensor ha = plain.Step(absl::MakeSpan(ia));
      worst = std::max(worst, MaxAbsDiff(ha, padded.Step(absl::MakeSpan(ib))));
      worst_split = std::max(worst_split, MaxAbsDiff(ha, tensor_ops.Step(absl::MakeSpan(it))));
    }
    std::cout << DtypeName(mode.dtype) << " weights, " << DtypeName(mode.kv) << " memories: padded decode steps vs "
              << "unpadded, max |diff| " << worst << "; split attention vs tensor ops " << worst_split << "\n";
    EXPECT_LT(worst, mode.tolerance);
    EXPECT_LT(worst_split, mode.split_tolerance);
    EXPECT_EQ(padded.graph_counts().padded - before, 50) << "every decode step was padded";
    EXPECT_EQ(padded.graph_counts().captured, 0) << "nothing is captured on a CPU";
    EXPECT_EQ(plain.graph_counts().padded, 0);
    for (size_t s = 0; s < a.size(); ++s) {
      EXPECT_EQ(a[s].position(), b[s].position());
      EXPECT_EQ(a[s].length(), b[s].length());
    }
  }
}

// A window of one holds no memory: a pass with such a session takes the
// unpadded pass, with the same results. (A step of two tokens is fed a
// token a pass, docs/MODEL.md "Mixed steps"; with the window-of-one session
// beside it, the whole step stays one Pass.)
TEST(DecodeGraphsTest, StepsThatCannotBePaddedTakeTheUnpaddedPass) {
  const ModelConfig c = testing::SmallConfig();
  const TxlWeights w = TestWeights(c, 32);
  IncrementalModel plain = Generic(c, w, false, WeightDtype::kFloat32, KvDtype::kFloat32);
  IncrementalModel padded = Generic(c, w, true, WeightDtype::kFloat32, KvDtype::kFloat32);
  SessionMemory a1(c.n_layer, 1), b1(c.n_layer, 1), a2(c.n_layer, c.mem_len), b2(c.n_layer, c.mem_len);
  for (int step = 0; step < 6; ++step) {
    const std::vector<int64_t> one = {step % c.n_token};
    const std::vector<int64_t> two = {(step + 1) % c.n_token, (step + 2) % c.n_token};
    std::vector<StepInput> ia = {Row(&a1, one), Row(&a2, step % 2 ? two : one)};
    std::vector<StepInput> ib = {Row(&b1, one), Row(&b2, step % 2 ? two : one)};
    EXPECT_LT(MaxAbsDiff(plain.Step(absl::MakeSpan(ia)), padded.Step(absl::MakeSpan(ib))), 1e-6);
  }
  EXPECT_EQ(padded.graph_counts().padded, 0);
  // Without the window-of-one session, the one-token steps are padded.
  const StepInput alone = Row(&b2, {3});
  padded.Step(absl::MakeConstSpan(&alone, 1));
  EXPECT_EQ(padded.graph_counts().padded, 1);
}

// Multi-token passes padded to a bucket (a GPU captures them: scoring
// steps, prefill chunks, turns' inputs) against the unpadded pass: sessions
// of several windows (one of one position, two shorter than most feeds, so
// that a pass overwrites keys its own earlier queries read) feed 1 to 12
// tokens in changing subsets, the pool growing half way. Every hidden state,
// position and length agrees; so do decode steps after, which read every
// key the padded passes wrote. Short feeds are not split off (with graphs
// they would take the split decode attention, without them the tensor ops:
// DecodeGraphsTest compares those), so both models run whole steps.
TEST(PassGraphsTest, PaddedMultiTokenPassesEqualTheUnpaddedPass) {
  struct Mode {
    WeightDtype dtype;
    KvDtype kv;
    double tolerance;
  };
  // Padding changes the products' shapes, so their sums' order: 1.4e-6 in
  // float32. Rounding to bfloat16 (the keys kept, the products' inputs) then
  // takes some values to the neighbouring bfloat16, which the later layers
  // carry: held to the stated tolerances between chunkings
  // (docs/PERFORMANCE.md, "Stated tolerances"), since padding is another
  // summation order as chunking is.
  for (const Mode mode :
       {Mode{WeightDtype::kFloat32, KvDtype::kFloat32, 1e-5}, Mode{WeightDtype::kFloat32, KvDtype::kBfloat16, 0.02},
        Mode{WeightDtype::kBfloat16, KvDtype::kBfloat16, 0.05}}) {
    ModelConfig c = testing::SmallConfig();
    c.mem_len = 40;
    const TxlWeights w = TestWeights(c, 41);
    IncrementalModel plain = Generic(c, w, false, mode.dtype, mode.kv, true, false);
    IncrementalModel padded = Generic(c, w, true, mode.dtype, mode.kv, true, false, true);
    const std::vector<int64_t> windows = {40, 5, 33, 2, 1, 20};
    std::vector<SessionMemory> a, b;
    a.reserve(32);
    b.reserve(32);
    for (int64_t window : windows) {
      a.emplace_back(c.n_layer, window);
      b.emplace_back(c.n_layer, window);
    }
    double worst = 0;
    for (int step = 0; step < 30; ++step) {
      if (step == 15) {
        const int64_t rows = padded.pool()->rows();
        for (int i = 0; i < 12; ++i) {
          a.emplace_back(c.n_layer, 40);
          b.emplace_back(c.n_layer, 40);
          const std::vector<int64_t> fill = RandomTokens(39, c.n_token, 300 + i);
          const StepInput ia = Row(&a.back(), fill), ib = Row(&b.back(), fill);
          worst = std::max(
              worst, MaxAbsDiff(plain.Step(absl::MakeConstSpan(&ia, 1)), padded.Step(absl::MakeConstSpan(&ib, 1))));
        }
        EXPECT_GT(padded.pool()->rows(), rows) << "the pool grew";
      }
      std::vector<StepInput> ia, ib;
      for (size_t s = 0; s < a.size(); ++s) {
        if ((step + s) % 3 == 0) continue;
        const int64_t n = 1 + (step * 5 + static_cast<int64_t>(s) * 3) % 12;
        const std::vector<int64_t> tokens = RandomTokens(n, c.n_token, 1000 * step + static_cast<int>(s));
        ia.push_back(Row(&a[s], tokens));
        ib.push_back(Row(&b[s], tokens));
      }
      worst = std::max(worst, MaxAbsDiff(plain.Step(absl::MakeSpan(ia)), padded.Step(absl::MakeSpan(ib))));
    }
    {  // a new session feeding past its window overwrites nothing committed: padded too
      a.emplace_back(c.n_layer, 4);
      b.emplace_back(c.n_layer, 4);
      const std::vector<int64_t> tokens = RandomTokens(12, c.n_token, 77);
      const StepInput ia = Row(&a.back(), tokens), ib = Row(&b.back(), tokens);
      const int64_t passes = padded.graph_counts().pass_padded;
      worst = std::max(worst,
                       MaxAbsDiff(plain.Step(absl::MakeConstSpan(&ia, 1)), padded.Step(absl::MakeConstSpan(&ib, 1))));
      EXPECT_EQ(padded.graph_counts().pass_padded, passes + 1);
    }
    for (int step = 0; step < 3; ++step) {  // decode steps read what the padded passes wrote
      std::vector<StepInput> ia, ib;
      for (size_t s = 0; s < a.size(); ++s) {
        ia.push_back(Row(&a[s], {(step + static_cast<int64_t>(s)) % c.n_token}));
        ib.push_back(Row(&b[s], {(step + static_cast<int64_t>(s)) % c.n_token}));
      }
      worst = std::max(worst, MaxAbsDiff(plain.Step(absl::MakeSpan(ia)), padded.Step(absl::MakeSpan(ib))));
    }
    std::cout << DtypeName(mode.dtype) << " weights, " << DtypeName(mode.kv) << " memories: padded passes vs "
              << "unpadded, max |diff| " << worst << "; " << padded.graph_counts().pass_padded
              << " padded multi-token passes\n";
    EXPECT_LT(worst, mode.tolerance);
    EXPECT_GT(padded.graph_counts().pass_padded, 25);
    EXPECT_EQ(padded.graph_counts().pass_captured, 0) << "nothing is captured on a CPU";
    EXPECT_EQ(plain.graph_counts().pass_padded, 0);
    for (size_t s = 0; s < a.size(); ++s) {
      EXPECT_EQ(a[s].position(), b[s].position()) << "session " << s;
      EXPECT_EQ(a[s].length(), b[s].length()) << "session " << s;
    }
  }
}

// Passes past IncrementalModel::kPassGraphTokens padded tokens are not
// padded (their launches are a small part of their time, and a capture
// would keep their score blocks), and once kPassGraphBuckets buckets of
// passes are held, neither are passes of new buckets; the results are the
// same.
TEST(PassGraphsTest, PassesPastTheLimitRunUnpadded) {
  ModelConfig c = testing::SmallConfig();
  c.mem_len = 64;
  const TxlWeights w = TestWeights(c, 43);
  IncrementalModel plain = Generic(c, w, false, WeightDtype::kFloat32, KvDtype::kFloat32);
  IncrementalModel padded = Generic(c, w, true, WeightDtype::kFloat32, KvDtype::kFloat32, true, true, true);
  std::vector<SessionMemory> a, b;
  a.reserve(5);
  b.reserve(5);
  std::vector<StepInput> ia, ib;
  for (int s = 0; s < 5; ++s) {  // 8 sessions' bucket x 512 tokens: 4,096 padded tokens
    a.emplace_back(c.n_layer, c.mem_len);
    b.emplace_back(c.n_layer, c.mem_len);
    const std::vector<int64_t> tokens = RandomTokens(300, c.n_token, 60 + s);
    ia.push_back(Row(&a.back(), tokens));
    ib.push_back(Row(&b.back(), tokens));
  }
  EXPECT_LT(MaxAbsDiff(plain.Step(absl::MakeSpan(ia)), padded.Step(absl::MakeSpan(ib))), 1e-5);
  EXPECT_EQ(padded.graph_counts().pass_padded, 0);
  ia.resize(1);  // one session's 300 tokens: 512 padded, within the limit
  ib.resize(1);
  EXPECT_LT(MaxAbsDiff(plain.Step(absl::MakeSpan(ia)), padded.Step(absl::MakeSpan(ib))), 1e-5);
  EXPECT_EQ(padded.graph_counts().pass_padded, 1);

  // A long window: one session's 130-token passes each take a new bucket of
  // keys (the keys grow by more than a bucket's 128 a pass).
  // The pool is reserved ahead, as a GPU's is: its growth would drop the
  // captures (and the count of buckets held).
  ModelConfig lc = testing::SmallConfig();
  lc.n_layer = 1;
  lc.mem_len = 6000;
  const TxlWeights lw = TestWeights(lc, 44);
  IncrementalModel long_plain = Generic(lc, lw, false, WeightDtype::kFloat32, KvDtype::kFloat32);
  IncrementalModel long_padded = Generic(lc, lw, true, WeightDtype::kFloat32, KvDtype::kFloat32, true, true, true);
  long_padded.ReserveSessionMemory(int64_t{2} * lc.mem_len * lc.n_head * lc.d_head * 4 * 2);
  const int64_t rows = long_padded.pool()->rows();
  SessionMemory la(lc.n_layer, lc.mem_len), lb(lc.n_layer, lc.mem_len);
  double worst = 0;
  for (int pass = 0; pass < IncrementalModel::kPassGraphBuckets + 8; ++pass) {
    const std::vector<int64_t> tokens = RandomTokens(130, lc.n_token, 70 + pass);
    const StepInput xa = Row(&la, tokens), xb = Row(&lb, tokens);
    worst = std::max(
        worst, MaxAbsDiff(long_plain.Step(absl::MakeConstSpan(&xa, 1)), long_padded.Step(absl::MakeConstSpan(&xb, 1))));
  }
  EXPECT_LT(worst, 1e-5);
  ASSERT_EQ(long_padded.pool()->rows(), rows) << "the pool did not grow";
  EXPECT_EQ(long_padded.graphs_held(), IncrementalModel::kPassGraphBuckets);
  EXPECT_EQ(long_padded.graph_counts().pass_padded, IncrementalModel::kPassGraphBuckets) << "the last 8 unpadded";
}

}  // namespace
}  // namespace txl
