// The math of model/: the incremental form is chunk- and batch-invariant and
// agrees with the training form (docs/MODEL.md, "Why it equals the authors'
// computation").
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <memory>

#include "base/malloc_tuning.h"
#include "tests/model/model_fixture.h"
#include "train/training_forward.h"

namespace txl {
namespace {

using testing::FeedInChunks;
using testing::MaxAbsDiff;
using testing::RandomTokens;
using testing::Row;
using testing::TestWeights;

class VariantTest : public ::testing::TestWithParam<testing::NamedConfig> {};

TEST_P(VariantTest, ChunkingDoesNotChangeLogProbs) {
  const ModelConfig& c = GetParam().config;
  IncrementalModel model(c, TestWeights(c, 7), at::kCPU, testing::TestPrecision());
  const auto tokens = RandomTokens(4 * c.mem_len, c.n_token, 11);  // history > mem_len
  SessionMemory whole(c.n_layer, c.mem_len), ones(c.n_layer, c.mem_len), sevens(c.n_layer, c.mem_len);
  at::Tensor a = FeedInChunks(model, whole, tokens, tokens.size());
  at::Tensor b = FeedInChunks(model, ones, tokens, 1);
  at::Tensor d = FeedInChunks(model, sevens, tokens, 7);
  const double diff = std::max(MaxAbsDiff(a, b), MaxAbsDiff(a, d));
  std::cout << GetParam().name << " chunk 1/7/all max|diff| = " << diff << "\n";
  EXPECT_LT(diff, 1e-5);
  EXPECT_EQ(whole.position(), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(ones.length(), c.mem_len - 1);

  // The check is only meaningful if the window matters: a shorter one differs.
  SessionMemory short_window(c.n_layer, c.mem_len / 3);
  EXPECT_GT(MaxAbsDiff(a, FeedInChunks(model, short_window, tokens, 5)), 1e-3);
}

TEST_P(VariantTest, TrainingFormWithSameLengthMatchesIncremental) {
  ModelConfig c = GetParam().config;
  c.same_length = true;
  const TxlWeights w = TestWeights(c, 5);
  IncrementalModel model(c, w, at::kCPU, testing::TestPrecision());
  const int64_t n = 3 * c.mem_len + 4, tgt_len = 5;
  const auto s0 = RandomTokens(n, c.n_token, 1), s1 = RandomTokens(n, c.n_token, 2);

  // Training form: two parallel streams [n, 2], segments of tgt_len, mems carried.
  at::Tensor tokens = at::stack({at::tensor(s0), at::tensor(s1)}, 1);
  std::vector<at::Tensor> mems, rows;
  for (int64_t s = 0; s < n; s += tgt_len) {
    SegmentOutput out = TrainingForward(c, w, tokens.slice(0, s, std::min(n, s + tgt_len)), mems, false);
    mems = out.mems;
    rows.push_back(out.hidden);
  }
  at::Tensor hidden = at::cat(rows, 0);  // [n, 2, d]
  for (int64_t b = 0; b < 2; ++b) {
    SessionMemory mem(c.n_layer, c.mem_len);
    at::Tensor incremental = FeedInChunks(model, mem, b == 0 ? s0 : s1, 3);
    at::Tensor training = LogProbs(c, w, hidden.select(1, b));
    const double diff = MaxAbsDiff(incremental, training);
    std::cout << GetParam().name << " stream " << b << " training vs incremental max|diff| = " << diff << "\n";
    EXPECT_LT(diff, 1e-5);
  }
}

// Steps two models through one schedule of four sessions (windows
// mem_len, 4, mem_len and 1): step 0 feeds each its history in one pass
// (0, 5, 2 * mem_len and 9 tokens), later steps one token each, except
// session 3, which feeds three every fifth step; windows fill and wrap.
// Returns the largest difference of their log-probs; every log-prob of `b`
// must be finite, and the sessions end at the same places.
double LargestDifferenceOverSchedule(const ModelConfig& c, const TxlWeights& w, IncrementalModel& model_a,
                                     IncrementalModel& model_b, int steps, uint32_t seed_per_step) {
  const std::vector<int64_t> history = {0, 5, 2 * c.mem_len, 9}, window = {c.mem_len, 4, c.mem_len, 1};
  std::vector<SessionMemory> a, b;
  for (size_t i = 0; i < history.size(); ++i) {
    a.emplace_back(c.n_layer, window[i]);
    b.emplace_back(c.n_layer, window[i]);
  }
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<StepInput> in_a, in_b;
    for (size_t i = 0; i < history.size(); ++i) {
      const int64_t n = step == 0 ? history[i] : (i == 3 && step % 5 == 0 ? 3 : 1);
      const auto tokens = RandomTokens(n, c.n_token, seed_per_step * step + static_cast<uint32_t>(i));
      in_a.push_back(Row(&a[i], tokens));
      in_b.push_back(Row(&b[i], tokens));
    }
    const at::Tensor la = LogProbs(c, w, model_a.Step(absl::MakeSpan(in_a)));
    const at::Tensor lb = LogProbs(c, w, model_b.Step(absl::MakeSpan(in_b)));
    EXPECT_TRUE(lb.isfinite().all().item<bool>()) << "step " << step;
    worst = std::max(worst, MaxAbsDiff(la, lb));
  }
  for (size_t i = 0; i < history.size(); ++i) {
    EXPECT_EQ(a[i].position(), b[i].position());
    EXPECT_EQ(a[i].length(), b[i].length());
  }
  return worst;
}

// The generic path (libtorch's ops: what a GPU runs) against the CPU's own
// kernels, in one process: prefills, then batched decode steps beside a
// prefill, windows filling and wrapping.
TEST_P(VariantTest, GenericKernelsMatchTheCpuKernels) {
  const ModelConfig& c = GetParam().config;
  const TxlWeights w = TestWeights(c, 13);
  IncrementalModel::Precision generic;
  generic.kernels = Kernels::kGeneric;
  IncrementalModel native(c, w, at::kCPU), tensor_ops(c, w, at::kCPU, generic);
  EXPECT_NE(native.KernelPath().find("decode kernels"), std::string::npos) << native.KernelPath();
  EXPECT_NE(tensor_ops.KernelPath().find("generic"), std::string::npos) << tensor_ops.KernelPath();
  const double worst = LargestDifferenceOverSchedule(c, w, native, tensor_ops, 3 * c.mem_len, 1000);
  std::cout << GetParam().name << " generic vs CPU kernels max|diff| = " << worst << "\n";
  EXPECT_LT(worst, 1e-5);
}

// The generic path's pass attention as one at::scaled_dot_product_attention
// (Precision::sdpa_pass_attention) against its tensor ops, in float32, on
// every pass of LargestDifferenceOverSchedule's schedule (the split decode
// attention off, so that one-token steps take it too): prefills of
// different lengths side by side, windows filling and wrapping, padded
// queries; and again with decode graphs, whose passes are padded to buckets
// (run eagerly on a CPU). Debian's libtorch 1.13 has no SDPA: there asking
// for it leaves it off (CI's cuda-test phase runs this test against 2.11).
TEST_P(VariantTest, SdpaPassAttentionMatchesTheTensorOps) {
  const ModelConfig& c = GetParam().config;
  const TxlWeights w = TestWeights(c, 17);
  IncrementalModel::Precision ops;
  ops.kernels = Kernels::kGeneric;
  ops.split_decode_attention = false;
  IncrementalModel reference(c, w, at::kCPU, ops);
  EXPECT_EQ(reference.KernelPath().find("pass attention fused"), std::string::npos) << reference.KernelPath();
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "padded passes (decode graphs)" : "unpadded passes");
    IncrementalModel::Precision fused = ops;
    fused.sdpa_pass_attention = true;
    fused.decode_graphs = graphs;
    IncrementalModel sdpa(c, w, at::kCPU, fused);
    EXPECT_EQ(sdpa.KernelPath().find("pass attention fused") != std::string::npos, TorchHasSdpa()) << sdpa.KernelPath();
    if (!TorchHasSdpa()) return;
    const double worst = LargestDifferenceOverSchedule(c, w, reference, sdpa, 2 * c.mem_len, 700);
    std::cout << GetParam().name << (graphs ? " padded" : "")
              << " scaled_dot_product_attention vs tensor ops max|diff| = " << worst << "\n";
    EXPECT_LT(worst, 1e-5);
    if (graphs) {
      EXPECT_GT(sdpa.graph_counts().pass_padded, 0) << "no padded multi-token pass ran";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, VariantTest, ::testing::ValuesIn(testing::Variants()),
                         [](const auto& info) { return info.param.name; });

// CTest's second run of these tests (TXL_TEST_KERNELS=generic) is on the
// generic path, and the first on the CPU's kernels.
TEST(IncrementalTest, RunsOnTheKernelsTheTestRunAskedFor) {
  const ModelConfig c = testing::SmallConfig();
  IncrementalModel model(c, TestWeights(c, 1), at::kCPU, testing::TestPrecision());
  const bool generic = model.KernelPath().find("generic") != std::string::npos;
  EXPECT_EQ(generic, testing::TestKernels() == Kernels::kGeneric) << model.KernelPath();
}

#if defined(__SANITIZE_ADDRESS__)
#define TXL_ASAN_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TXL_ASAN_ALLOCATOR 1
#endif
#endif

// Resident bytes of this process (/proc/self/statm's second field).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// A float32 or bfloat16 model on the CPU kernels keeps its product matrices
// once, in the packed panels (incremental.h, DecodeMatrix): building it adds
// about their bytes to the process (less where freed pages are reused),
// where a row-major copy beside the panels added twice that (W5 in
// docs/PERFORMANCE.md). The caller's weights stay alive, as the
// checkpoint's do while the server loads.
TEST(WeightMemoryTest, ProductsAreHeldOnce) {
#ifdef TXL_ASAN_ALLOCATOR
  // ASan's allocator keeps freed blocks in quarantine, so the load's
  // temporaries (each matrix narrowed before it is packed) stay resident.
  GTEST_SKIP() << "ASan's allocator keeps freed memory resident";
#endif
  // Large enough (50 MB of float32 products) that the fixed costs of a
  // load, such as a 2 MB huge page for the biases, stay small beside it:
  // with 12.6 MB, the CUDA wheel's libtorch added 9.5 MB for 6.3 MB of
  // bfloat16 panels.
  ModelConfig c = testing::SmallConfig();
  c.n_layer = 4;
  c.d_model = 512;
  c.n_head = 8;
  c.d_head = 64;
  c.d_inner = 2048;
  const TxlWeights w = TestWeights(c, 2);
  int64_t products = 0;
  for (const LayerWeights& L : w.layers) {
    for (const at::Tensor* t : {&L.qkv_w, &L.o_w, &L.ff1_w, &L.ff2_w}) products += t->numel() * 4;
  }
  for (const WeightDtype dtype : {WeightDtype::kFloat32, WeightDtype::kBfloat16}) {
    IncrementalModel::Precision p;
    p.dtype = dtype;
    const int64_t bytes = dtype == WeightDtype::kFloat32 ? products : products / 2;
    ReleaseFreedMemory();
    const int64_t before = ResidentBytes();
    IncrementalModel model(c, w, at::kCPU, p);
    ReleaseFreedMemory();  // as txl-server does after its load: freed temporaries are not held
    const int64_t added = ResidentBytes() - before;
    EXPECT_LT(added, bytes * 3 / 2) << added << " bytes added for " << bytes << " bytes of product weights";
  }
}

TEST(IncrementalTest, BatchingDoesNotChangeLogProbs) {
  ModelConfig c = testing::Variants()[2].config;  // adaptive softmax, div_val 2
  IncrementalModel model(c, TestWeights(c, 3), at::kCPU, testing::TestPrecision());
  // Four sessions with different histories, windows and chunk lengths.
  const std::vector<int64_t> history = {3, 15, 0, 30}, chunk = {5, 1, 9, 2}, window = {12, 12, 8, 20};
  std::vector<SessionMemory> alone, batched;
  std::vector<std::vector<int64_t>> prefix, next;
  for (int b = 0; b < 4; ++b) {
    alone.emplace_back(c.n_layer, window[b]);
    batched.emplace_back(c.n_layer, window[b]);
    prefix.push_back(RandomTokens(history[b], c.n_token, 100 + b));
    next.push_back(RandomTokens(chunk[b], c.n_token, 200 + b));
  }
  double worst = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<StepInput> items;
    std::vector<at::Tensor> expected;
    for (int b = 0; b < 4; ++b) {
      const auto& toks = round == 0 ? prefix[b] : next[b];
      if (!toks.empty()) expected.push_back(FeedInChunks(model, alone[b], toks, toks.size()));
      items.push_back(Row(&batched[b], toks));
    }
    at::Tensor got = LogProbs(c, model.weights(), model.Step(absl::MakeSpan(items)));
    worst = std::max(worst, MaxAbsDiff(got, at::cat(expected, 0)));
  }
  std::cout << "batched vs alone max|diff| = " << worst << "\n";
  EXPECT_LT(worst, 1e-5);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(batched[b].position(), alone[b].position());
}

TEST(IncrementalTest, MemLenOneSeesOnlyTheTokenItself) {
  ModelConfig c = testing::SmallConfig();
  IncrementalModel model(c, TestWeights(c, 9), at::kCPU, testing::TestPrecision());
  SessionMemory a(c.n_layer, 1), b(c.n_layer, 1);
  at::Tensor la = FeedInChunks(model, a, {3, 4, 5, 6}, 4);
  at::Tensor lb = FeedInChunks(model, b, {9, 1, 2, 6}, 2);
  EXPECT_LT(MaxAbsDiff(la[3], lb[3]), 1e-5);
  EXPECT_GT(MaxAbsDiff(la[2], lb[2]), 1e-3);
  EXPECT_EQ(a.length(), 0);
  EXPECT_EQ(a.bytes(), 0);
}

TEST(IncrementalTest, MemoryHoldsMemLenMinusOnePositions) {
  ModelConfig c = testing::SmallConfig();
  IncrementalModel model(c, TestWeights(c, 9), at::kCPU, testing::TestPrecision());
  SessionMemory mem(c.n_layer, c.mem_len);
  FeedInChunks(model, mem, RandomTokens(5, c.n_token, 1), 5);
  EXPECT_EQ(mem.position(), 5);
  EXPECT_EQ(mem.length(), 5);
  FeedInChunks(model, mem, RandomTokens(30, c.n_token, 2), 4);
  EXPECT_EQ(mem.position(), 35);
  EXPECT_EQ(mem.length(), c.mem_len - 1);
  // Allocated: mem_len ring slots (the held positions plus the one a step writes into).
  EXPECT_EQ(mem.bytes(), 2 * c.n_layer * c.mem_len * c.n_head * c.d_head * 4);
}

TEST(IncrementalTest, CloneDivergesIndependently) {
  ModelConfig c = testing::SmallConfig();
  IncrementalModel model(c, TestWeights(c, 4), at::kCPU, testing::TestPrecision());
  SessionMemory original(c.n_layer, c.mem_len), control(c.n_layer, c.mem_len);
  const auto prefix = RandomTokens(20, c.n_token, 1);
  FeedInChunks(model, original, prefix, 20);
  FeedInChunks(model, control, prefix, 20);
  SessionMemory fork = original.Copy();
  EXPECT_EQ(fork.position(), 20);
  // The fork goes its own way; the original must not notice.
  FeedInChunks(model, fork, RandomTokens(9, c.n_token, 2), 3);
  const auto same = RandomTokens(6, c.n_token, 3);
  EXPECT_LT(MaxAbsDiff(FeedInChunks(model, original, same, 6), FeedInChunks(model, control, same, 6)), 1e-6);
  EXPECT_EQ(fork.position(), 29);
}

TEST(IncrementalTest, EmptyInputsAdvanceNothing) {
  ModelConfig c = testing::SmallConfig();
  IncrementalModel model(c, TestWeights(c, 4), at::kCPU, testing::TestPrecision());
  SessionMemory a(c.n_layer, c.mem_len), b(c.n_layer, c.mem_len);
  std::vector<StepInput> items = {Row(&a, {}), Row(&b, {1, 2, 3})};
  at::Tensor h = model.Step(absl::MakeSpan(items));
  EXPECT_EQ(h.size(0), 3);
  EXPECT_EQ(a.position(), 0);
  EXPECT_EQ(b.position(), 3);
}

// Memory layout (ring buffers, slot = position % mem_len, grown until
// mem_len): decoding one token at a time writes keys in place; across every
// growth and many wraps it must agree with feeding the history at once.
// Bounded replay (docs/SESSIONS.md, "Bounded replay"): the state after a
// history depends only on its last n_layer x (mem_len - 1) tokens, so an
// empty memory that starts where they start, fed only them, continues as
// the whole history does. Windows whose replay starts before the ring wraps
// (partial), exactly at the receptive field (full), and far past it (wrapping).
TEST_P(VariantTest, BoundedReplayContinuesAsTheWholeHistory) {
  const ModelConfig& c = GetParam().config;
  IncrementalModel model(c, TestWeights(c, 8), at::kCPU, testing::TestPrecision());
  for (const int64_t window : {c.mem_len, int64_t{5}}) {
    const int64_t field = c.n_layer * (window - 1);
    for (const int64_t n : {field, field + 2, 3 * field + window + 1}) {
      SCOPED_TRACE(::testing::Message() << "window " << window << ", history " << n);
      const auto history = RandomTokens(n, c.n_token, static_cast<uint32_t>(n + window));
      const auto next = RandomTokens(2 * window + 3, c.n_token, 5);
      SessionMemory whole(c.n_layer, window);
      FeedInChunks(model, whole, history, 7);
      auto replay = [&](int64_t tokens) {
        auto m = std::make_unique<SessionMemory>(c.n_layer, window, 0, n - tokens);
        FeedInChunks(model, *m, std::vector<int64_t>(history.end() - tokens, history.end()), 4);
        return m;
      };
      auto bounded = replay(field);
      EXPECT_EQ(bounded->position(), n);
      EXPECT_EQ(bounded->length(), whole.length());
      // Continued one token at a time, then in a chunk: the same log-probs.
      at::Tensor a = FeedInChunks(model, whole, next, 1), b = FeedInChunks(model, *bounded, next, 1);
      EXPECT_LT(MaxAbsDiff(a, b), 1e-5);
      EXPECT_LT(MaxAbsDiff(FeedInChunks(model, whole, next, 5), FeedInChunks(model, *bounded, next, 5)), 1e-5);
      // The bound is tight: one layer's reach fewer tokens is another state.
      if (c.n_layer > 1 && n > field) {
        SessionMemory again(c.n_layer, window);
        FeedInChunks(model, again, history, 7);
        auto shorter = replay(field - (window - 1));
        EXPECT_GT(MaxAbsDiff(FeedInChunks(model, again, next, 1), FeedInChunks(model, *shorter, next, 1)), 1e-4);
      }
    }
  }
}

TEST(IncrementalTest, RingGrowthAndWrapsMatchOneShotFeed) {
  ModelConfig c = testing::SmallConfig();
  IncrementalModel model(c, TestWeights(c, 6), at::kCPU, testing::TestPrecision());
  const int64_t window = 37;  // odd, so the wrap point moves around
  const auto tokens = RandomTokens(5 * window + 3, c.n_token, 21);
  SessionMemory ones(c.n_layer, window), whole(c.n_layer, window);
  at::Tensor a = FeedInChunks(model, ones, tokens, 1);
  at::Tensor b = FeedInChunks(model, whole, tokens, tokens.size());
  EXPECT_LT(MaxAbsDiff(a, b), 1e-5);
  EXPECT_EQ(ones.capacity(), window);
  EXPECT_EQ(ones.length(), window - 1);
  EXPECT_EQ(ones.bytes(), whole.bytes());
  // Then both continue with mixed chunks; still the same.
  const auto more = RandomTokens(50, c.n_token, 22);
  EXPECT_LT(MaxAbsDiff(FeedInChunks(model, ones, more, 3), FeedInChunks(model, whole, more, 1)), 1e-5);
}

// A decode step runs every layer in one parallel region whose parts meet at
// barriers (decode_step.h). Called where the pool is busy (inside another
// parallel region) one thread runs every part: it must neither wait for
// parts nobody else runs nor compute anything differently.
TEST(IncrementalTest, DecodeStepInsideAParallelRegionMatchesExactly) {
  ModelConfig c = testing::SmallConfig();
  IncrementalModel model(c, TestWeights(c, 8), at::kCPU, testing::TestPrecision());
  const auto tokens = RandomTokens(2 * c.mem_len, c.n_token, 23);
  SessionMemory team(c.n_layer, c.mem_len), alone(c.n_layer, c.mem_len);
  const at::Tensor a = FeedInChunks(model, team, tokens, 1);
  at::Tensor b;
  // One part per thread, so that the pool really runs a region (libtorch 2.x runs a loop of one
  // part inline, outside any region); the part at 0 feeds the session.
  at::parallel_for(0, std::max(2, at::get_num_threads()), 1, [&](int64_t begin, int64_t) {
    if (begin != 0) return;
    EXPECT_TRUE(at::in_parallel_region() || at::get_num_threads() == 1);
    b = FeedInChunks(model, alone, tokens, 1);
  });
  EXPECT_EQ(MaxAbsDiff(a, b), 0.0);
  EXPECT_EQ(alone.position(), team.position());

  // Several sessions per step take the other one-region path (DecodeBatchLayers).
  std::vector<SessionMemory> two_team, two_alone;
  for (int i = 0; i < 3; ++i) {
    two_team.emplace_back(c.n_layer, c.mem_len);
    two_alone.emplace_back(c.n_layer, c.mem_len);
  }
  auto steps = [&](std::vector<SessionMemory>& memories) {
    std::vector<at::Tensor> rows;
    for (size_t s = 0; s < tokens.size(); ++s) {
      std::vector<StepInput> items;
      for (size_t i = 0; i < memories.size(); ++i)
        items.push_back(Row(&memories[i], {tokens[(s + 5 * i) % tokens.size()]}));
      rows.push_back(model.Step(absl::MakeSpan(items)));
    }
    return at::cat(rows, 0);
  };
  const at::Tensor c_team = steps(two_team);
  at::Tensor c_alone;
  at::parallel_for(0, std::max(2, at::get_num_threads()), 1, [&](int64_t begin, int64_t) {
    if (begin == 0) c_alone = steps(two_alone);
  });
  EXPECT_EQ(MaxAbsDiff(c_team, c_alone), 0.0);
}

// A fork of a wrapped session decodes in place in its own buffers: the fork
// and the original, fed the same tokens, agree, and feeding one leaves the
// other's later results unchanged.
TEST(IncrementalTest, ForkOfWrappedSessionDecodesIndependently) {
  ModelConfig c = testing::SmallConfig();
  IncrementalModel model(c, TestWeights(c, 8), at::kCPU, testing::TestPrecision());
  SessionMemory original(c.n_layer, c.mem_len);
  FeedInChunks(model, original, RandomTokens(3 * c.mem_len + 5, c.n_token, 1), 1);
  SessionMemory fork = original.Copy();
  FeedInChunks(model, fork, RandomTokens(7, c.n_token, 2), 1);  // diverges in place
  SessionMemory fork2 = original.Copy();
  const auto same = RandomTokens(9, c.n_token, 3);
  EXPECT_LT(MaxAbsDiff(FeedInChunks(model, original, same, 1), FeedInChunks(model, fork2, same, 9)), 1e-5);
}

// One step mixing an input longer than a pass with single-token decodes
// (the long one's second pass reads the memory its first pass built).
TEST(IncrementalTest, LongInputBesideDecodesMatchesAlone) {
  ModelConfig c = testing::SmallConfig();
  IncrementalModel model(c, TestWeights(c, 2), at::kCPU, testing::TestPrecision());
  const int64_t n_long = IncrementalModel::kPassTokens + 2;
  SessionMemory a(c.n_layer, c.mem_len), b(c.n_layer, 5), a_alone(c.n_layer, c.mem_len), b_alone(c.n_layer, 5);
  const auto pa = RandomTokens(30, c.n_token, 4), pb = RandomTokens(11, c.n_token, 5);
  FeedInChunks(model, a, pa, 30);
  FeedInChunks(model, a_alone, pa, 30);
  FeedInChunks(model, b, pb, 11);
  FeedInChunks(model, b_alone, pb, 11);
  const auto la = RandomTokens(n_long, c.n_token, 6);
  const std::vector<int64_t> lb = {7};
  std::vector<StepInput> items = {Row(&b, lb), Row(&a, la)};
  at::Tensor got = LogProbs(c, model.weights(), model.Step(absl::MakeSpan(items)));
  at::Tensor want = at::cat({FeedInChunks(model, b_alone, lb, 1), FeedInChunks(model, a_alone, la, 1)}, 0);
  EXPECT_LT(MaxAbsDiff(got, want), 1e-5);
  const auto next = RandomTokens(4, c.n_token, 7);
  EXPECT_LT(MaxAbsDiff(FeedInChunks(model, a, next, 1), FeedInChunks(model, a_alone, next, 4)), 1e-5);
}

// A session feeding at most kDecodeFeedTokens tokens feeds them a pass of
// one token at a time, beside the step's decoders (docs/MODEL.md, "Mixed
// steps"): decode passes on the CPU kernels; on the generic path with decode
// graphs, padded graph passes (run eagerly on a CPU). The answers are those of the
// multi-token pass, with windows full, filling and wrapping, and of length one.
enum class Path { kCpu, kGeneric, kGenericGraphs };
constexpr Path kPaths[] = {Path::kCpu, Path::kGeneric, Path::kGenericGraphs};
const char* PathName(Path path) {
  return path == Path::kCpu ? "cpu kernels" : path == Path::kGeneric ? "generic" : "generic, graphs";
}
IncrementalModel::Precision ShortFeeds(bool on, Path path = Path::kCpu) {
  IncrementalModel::Precision p;
  p.kernels = path == Path::kCpu ? Kernels::kAuto : Kernels::kGeneric;
  p.decode_graphs = path == Path::kGenericGraphs;
  p.decode_short_feeds = on;
  return p;
}

class ShortFeedsTest : public ::testing::TestWithParam<Path> {};
INSTANTIATE_TEST_SUITE_P(Paths, ShortFeedsTest, ::testing::ValuesIn(kPaths),
                         [](const ::testing::TestParamInfo<Path>& info) {
                           return std::string(info.param == Path::kCpu       ? "CpuKernels"
                                              : info.param == Path::kGeneric ? "Generic"
                                                                             : "GenericGraphs");
                         });

TEST_P(ShortFeedsTest, DecodedShortFeedsMatchTheMultiTokenPass) {
  ModelConfig c = testing::Variants()[4].config;  // untied biases
  IncrementalModel split(c, TestWeights(c, 31), at::kCPU, ShortFeeds(true, GetParam()));
  IncrementalModel whole(c, TestWeights(c, 31), at::kCPU, ShortFeeds(false, GetParam()));
  const std::vector<int64_t> history = {40, 3, 0, 25, 11, 9}, window = {12, 12, 8, 9, 1, 2};
  const std::vector<int64_t> feed = {2, 3, 1, 7, 2, 3};
  std::vector<SessionMemory> a, b;
  for (size_t s = 0; s < history.size(); ++s) {
    a.emplace_back(c.n_layer, window[s]);
    b.emplace_back(c.n_layer, window[s]);
    const auto prefix = RandomTokens(history[s], c.n_token, 500 + s);
    if (prefix.empty()) continue;
    FeedInChunks(split, a[s], prefix, 5);
    FeedInChunks(whole, b[s], prefix, 5);
  }
  double worst = 0;
  for (int round = 0; round < 6; ++round) {
    std::vector<StepInput> ia, ib;
    for (size_t s = 0; s < history.size(); ++s) {
      const auto toks = RandomTokens(feed[(s + round) % feed.size()], c.n_token, 700 + 10 * round + s);
      ia.push_back(Row(&a[s], toks));
      ib.push_back(Row(&b[s], toks));
    }
    at::Tensor got = LogProbs(c, split.weights(), split.Step(absl::MakeSpan(ia)));
    at::Tensor want = LogProbs(c, whole.weights(), whole.Step(absl::MakeSpan(ib)));
    worst = std::max(worst, MaxAbsDiff(got, want));
  }
  std::cout << PathName(GetParam()) << ": short feeds a token a pass vs the multi-token pass max|diff| = " << worst
            << "\n";
  EXPECT_LT(worst, 1e-5);
  for (size_t s = 0; s < history.size(); ++s) {
    EXPECT_EQ(a[s].position(), b[s].position());
    EXPECT_EQ(a[s].length(), b[s].length());
  }
}

// The ATen ops one step of seven decoders and one session feeding two
// tokens dispatches, windows full.
int64_t MixedStepOps(IncrementalModel& model, const ModelConfig& c);

TEST_P(ShortFeedsTest, AStepOfDecodersAndATwoTokenFeedTakesNoMultiTokenPass) {
  ModelConfig c = testing::SmallConfig();
  c.n_layer = 6;
  IncrementalModel split(c, TestWeights(c, 32), at::kCPU, ShortFeeds(true, GetParam()));
  IncrementalModel whole(c, TestWeights(c, 32), at::kCPU, ShortFeeds(false, GetParam()));
  const int64_t with = MixedStepOps(split, c), without = MixedStepOps(whole, c);
  std::cout << PathName(GetParam()) << ", 7 decoders + a 2-token feed, " << c.n_layer << " layers: " << with
            << " ops a token a pass, " << without << " through the multi-token pass\n";
  ASSERT_GT(without, 10 * c.n_layer) << "the counter saw the step";
  if (GetParam() == Path::kCpu) {
    EXPECT_LT(4 * with, without);
  }
  if (GetParam() == Path::kGeneric) {
    EXPECT_EQ(with, without) << "eager, the generic path keeps one Pass";
  }
  if (GetParam() == Path::kGenericGraphs) {
    // Both passes padded; on a GPU each is one graph launch (the eager
    // count here is what a capture records).
    EXPECT_EQ(split.graph_counts().padded, 2 * 2) << "the warm step's two passes and the counted step's";
    EXPECT_LT(with, without);
  }
}

// A step that throws after a short feed's later decode passes wrote into
// slots its session still held puts them back: the session goes on exactly
// as a twin that never took part.
TEST_P(ShortFeedsTest, AStepThatThrowsLeavesTheShortFeedsWindowsAsTheyWere) {
  ModelConfig c = testing::SmallConfig();
  IncrementalModel model(c, TestWeights(c, 33), at::kCPU, ShortFeeds(true, GetParam()));
  const auto prefix = RandomTokens(3 * c.mem_len, c.n_token, 34);
  SessionMemory a(c.n_layer, c.mem_len), twin(c.n_layer, c.mem_len), other(c.n_layer, c.mem_len);
  {
    // The position table grows to its largest first (a padded pass's bucket
    // may be wider than the window): a twin fed later must meet the same one.
    SessionMemory warm(c.n_layer, c.mem_len);
    FeedInChunks(model, warm, prefix, 7);
  }
  FeedInChunks(model, a, prefix, 7);
  FeedInChunks(model, twin, prefix, 7);
  ASSERT_EQ(a.length(), c.mem_len - 1) << "a full window: a second decode pass overwrites a held slot";
  std::vector<int64_t> bad = RandomTokens(IncrementalModel::kDecodeFeedTokens + 2, c.n_token, 35);
  bad.back() = c.n_token + 5;  // out of the vocabulary: the multi-token pass throws
  std::vector<StepInput> items = {Row(&a, RandomTokens(IncrementalModel::kDecodeFeedTokens, c.n_token, 36)),
                                  Row(&other, bad)};
  EXPECT_THROW(model.Step(absl::MakeSpan(items)), c10::Error);
  EXPECT_EQ(a.position(), twin.position());
  EXPECT_EQ(a.length(), twin.length());
  const auto next = RandomTokens(2 * c.mem_len, c.n_token, 37);
  EXPECT_EQ(MaxAbsDiff(FeedInChunks(model, a, next, 1), FeedInChunks(model, twin, next, 1)), 0.0);
}

// Batched single-token steps (the decode kernel: one (session, head) per
// item, head-major, the position term read per key) agree with each session
// alone, with windows full, filling and wrapping.
TEST(IncrementalTest, BatchedDecodeStepsMatchAlone) {
  ModelConfig c = testing::Variants()[4].config;  // untied biases
  IncrementalModel model(c, TestWeights(c, 12), at::kCPU, testing::TestPrecision());
  const std::vector<int64_t> history = {0, 3, 11, 40, 25, 7}, window = {12, 5, 12, 9, 30, 1};
  std::vector<SessionMemory> alone, batched;
  for (size_t b = 0; b < history.size(); ++b) {
    alone.emplace_back(c.n_layer, window[b]);
    batched.emplace_back(c.n_layer, window[b]);
    const auto prefix = RandomTokens(history[b], c.n_token, 300 + b);
    if (prefix.empty()) continue;
    FeedInChunks(model, alone[b], prefix, 4);
    FeedInChunks(model, batched[b], prefix, 4);
  }
  double worst = 0;
  for (int step = 0; step < 20; ++step) {
    std::vector<StepInput> items;
    std::vector<at::Tensor> expected;
    for (size_t b = 0; b < history.size(); ++b) {
      const std::vector<int64_t> tok = {(step * 7 + static_cast<int64_t>(b) * 5) % c.n_token};
      expected.push_back(FeedInChunks(model, alone[b], tok, 1));
      items.push_back(Row(&batched[b], tok));
    }
    at::Tensor got = LogProbs(c, model.weights(), model.Step(absl::MakeSpan(items)));
    worst = std::max(worst, MaxAbsDiff(got, at::cat(expected, 0)));
  }
  EXPECT_LT(worst, 1e-5);
  for (size_t b = 0; b < history.size(); ++b) EXPECT_EQ(batched[b].length(), alone[b].length());
}

// A step whose readout fails (LanguageModel::Step reads picks and log-probs
// there, before the memories commit) moves no session, with a status or an
// exception: a decoding session, a short feed over a full ring (its
// overwritten slots put back) and a long feed. Each then answers as a copy
// taken before the failure, bit for bit.
TEST(IncrementalTest, AFailedReadoutMovesNoSession) {
  const ModelConfig c = testing::SmallConfig();
  // The path under test, and the generic path with graphs, whose padded
  // passes (decode steps and the multi-token one) write the pool at once.
  IncrementalModel model(c, TestWeights(c, 13), at::kCPU, testing::TestPrecision());
  IncrementalModel::Precision graphs;
  graphs.kernels = Kernels::kGeneric;
  graphs.decode_graphs = true;
  IncrementalModel padded(c, TestWeights(c, 13), at::kCPU, graphs);
  // A decoding session, a short feed over a full ring, a long feed over a
  // short history, a several-token feed over a full ring.
  const std::vector<int64_t> history = {30, 30, 5, 30}, feed = {1, 2, 20, 6};
  for (IncrementalModel* m : {&model, &padded}) {
    for (int throws = 0; throws < 2; ++throws) {
      std::vector<SessionMemory> sessions, copies;
      sessions.reserve(history.size());
      copies.reserve(history.size());
      for (size_t b = 0; b < history.size(); ++b) {
        sessions.emplace_back(c.n_layer, c.mem_len);
        FeedInChunks(*m, sessions[b], RandomTokens(history[b], c.n_token, 70 + static_cast<int>(b)), 7);
        copies.push_back(sessions[b].Copy());
      }
      std::vector<std::vector<int64_t>> tokens;
      std::vector<StepInput> items;
      for (size_t b = 0; b < history.size(); ++b) {
        tokens.push_back(RandomTokens(feed[b], c.n_token, 80 + static_cast<int>(b)));
        items.push_back(Row(&sessions[b], tokens[b]));
      }
      int64_t rows_read = 0;
      const auto readout = [&](const at::Tensor& hidden) -> absl::Status {
        rows_read = hidden.size(0);
        if (throws) TORCH_CHECK(false, "injected readout failure");
        return absl::InternalError("injected readout failure");
      };
      const int64_t passes = m->graph_counts().pass_padded;
      if (throws) {
        EXPECT_THROW((void)m->Step(absl::MakeConstSpan(items), readout), c10::Error);
      } else {
        EXPECT_EQ(m->Step(absl::MakeConstSpan(items), readout).code(), absl::StatusCode::kInternal);
      }
      EXPECT_EQ(rows_read, 1 + 2 + 20 + 6) << "the readout saw the step's rows";
      if (m == &padded) {
        EXPECT_EQ(m->graph_counts().pass_padded, passes + 1) << "the long feeds took a padded pass";
      }
      for (size_t b = 0; b < history.size(); ++b) {
        EXPECT_EQ(sessions[b].position(), history[b]) << "session " << b;
        EXPECT_TRUE(at::equal(FeedInChunks(*m, sessions[b], tokens[b], 1), FeedInChunks(*m, copies[b], tokens[b], 1)))
            << (m == &padded ? "padded, " : "") << (throws ? "thrown, " : "a status, ") << "session " << b;
      }
    }
  }
}

// The decode kernel's own paths: head size 64 (values summed in registers),
// key counts that are and are not multiples of its 4-key groups and 8-lane
// softmax blocks, scores large enough that most softmax numerators underflow,
// sessions of several windows in one batch. Decoding one token at a time must
// agree with feeding the same history in one pass (no decode kernel).
TEST(IncrementalTest, DecodeKernelHeadSize64MatchesOnePass) {
  ModelConfig c = testing::SmallConfig();
  c.n_head = 2;
  c.d_head = 64;
  c.d_model = 48;
  c.mem_len = 21;
  IncrementalModel model(c, TestWeights(c, 31), at::kCPU, testing::TestPrecision());
  TxlWeights sharp = TestWeights(c, 31);  // sharper attention: queries scaled up
  for (LayerWeights& L : sharp.layers) L.qkv_w = L.qkv_w * 4;
  IncrementalModel peaked(c, sharp, at::kCPU, testing::TestPrecision());
  for (IncrementalModel* m : {&model, &peaked}) {
    const std::vector<int64_t> window = {21, 2, 9, 13, 1};
    std::vector<SessionMemory> stepped, whole;
    std::vector<std::vector<int64_t>> history(window.size());
    for (size_t b = 0; b < window.size(); ++b) {
      stepped.emplace_back(c.n_layer, window[b]);
      whole.emplace_back(c.n_layer, window[b]);
    }
    double worst = 0;
    for (int step = 0; step < 45; ++step) {
      std::vector<StepInput> items;
      for (size_t b = 0; b < window.size(); ++b) {
        const int64_t tok = (step * 11 + static_cast<int64_t>(b) * 3) % c.n_token;
        history[b].push_back(tok);
        items.push_back(Row(&stepped[b], {tok}));
      }
      at::Tensor got = LogProbs(c, m->weights(), m->Step(absl::MakeSpan(items)));
      for (size_t b = 0; b < window.size(); ++b) {
        SessionMemory fresh(c.n_layer, window[b]);
        at::Tensor want = FeedInChunks(*m, fresh, history[b], static_cast<int64_t>(history[b].size()));
        worst = std::max(worst, MaxAbsDiff(got.slice(0, b, b + 1), want.slice(0, -1)));
      }
    }
    // Peaked attention makes the log-probs large and their rounding with it
    // (the previous kernel measured 3.7e-4 here too).
    EXPECT_LT(worst, m == &model ? 1e-5 : 1e-3) << (m == &model ? "model" : "peaked");
  }
}

// The generic path keeps every session's memory in one pool of rows per
// layer (model/net/slot_pool.h).
IncrementalModel GenericModel(const ModelConfig& c, const TxlWeights& w, KvDtype kv = KvDtype::kFloat32,
                              bool split_decode_attention = true) {
  IncrementalModel::Precision p;
  p.kernels = Kernels::kGeneric;
  p.kv_dtype = kv;
  p.split_decode_attention = split_decode_attention;
  return IncrementalModel(c, w, at::kCPU, p);
}

TEST(SlotPoolTest, TakeGiveAndGrowKeepRowsAndNeverHandOutThePadRow) {
  SlotPool pool(2, 3, 4, at::TensorOptions().dtype(at::kFloat));
  const int64_t generation = pool.generation();
  std::vector<int64_t> a = pool.Take(10, SlotPool::Admitted::kYes);
  EXPECT_EQ(std::count(a.begin(), a.end(), SlotPool::kPadRow), 0);
  EXPECT_EQ(std::count(a.begin(), a.end(), SlotPool::kDiscardRow), 0);
  EXPECT_EQ(pool.generation(), generation) << "taking free rows keeps the tensors";
  pool.keys(1).index_fill_(0, at::tensor(a), 7.0);
  const int64_t before = pool.rows();
  std::vector<int64_t> b = pool.Take(before, SlotPool::Admitted::kYes);  // more than are free: the pool grows
  EXPECT_GT(pool.rows(), before);
  EXPECT_GT(pool.generation(), generation) << "growth replaces the tensors";
  EXPECT_EQ(std::count(b.begin(), b.end(), SlotPool::kPadRow), 0);
  EXPECT_EQ(std::count(b.begin(), b.end(), SlotPool::kDiscardRow), 0);
  EXPECT_TRUE(pool.keys(1).index_select(0, at::tensor(a)).eq(7).all().item<bool>());  // kept across the growth
  EXPECT_EQ(pool.keys(0)[SlotPool::kPadRow].abs().sum().item<float>(), 0);
  pool.Give(a);
  const std::vector<int64_t> again = pool.Take(10, SlotPool::Admitted::kYes);  // a's rows, handed out zeroed
  EXPECT_TRUE(pool.keys(1).index_select(0, at::tensor(again)).eq(0).all().item<bool>());
  std::vector<int64_t> all = b;
  all.insert(all.end(), again.begin(), again.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "a row handed out twice";
}

TEST(SlotPoolTest, SessionsLiveInThePoolAndGiveTheirRowsBack) {
  const ModelConfig c = testing::SmallConfig();
  IncrementalModel model = GenericModel(c, TestWeights(c, 21));
  ASSERT_NE(model.pool(), nullptr);
  const int64_t free_at_start = model.pool()->free_rows();
  {
    std::vector<SessionMemory> sessions;
    for (int i = 0; i < 8; ++i) sessions.emplace_back(c.n_layer, c.mem_len);
    for (int i = 0; i < 8; ++i) FeedInChunks(model, sessions[i], RandomTokens(3 + 4 * i, c.n_token, 40 + i), 3);
    for (const SessionMemory& s : sessions) {
      EXPECT_TRUE(s.pooled());
      // What it holds, as the rings would: 2 x layers x capacity x one row.
      EXPECT_EQ(s.bytes(), 2 * c.n_layer * s.capacity() * c.n_head * c.d_head * 4);
    }
    SessionMemory fork = sessions[4].Copy();
    EXPECT_TRUE(fork.pooled());
  }
  EXPECT_GT(model.pool()->rows(), free_at_start + 1) << "the sessions needed more rows than it began with";
  EXPECT_EQ(model.pool()->free_rows(), model.pool()->rows() - SlotPool::kReservedRows)
      << "every row but the padding and discard ones given back";
  // The CPU kernels keep rings.
  IncrementalModel native(c, TestWeights(c, 21), at::kCPU);
  EXPECT_EQ(native.pool(), nullptr);
  SessionMemory ring(c.n_layer, c.mem_len);
  FeedInChunks(native, ring, RandomTokens(4, c.n_token, 1), 4);
  EXPECT_FALSE(ring.pooled());
}

// A pooled memory's image is the rings' image: it restores onto either path,
// onto the generic one bit for bit, and its unwritten slots are zeros even
// where the rows held another session's keys.
TEST(SlotPoolTest, ImagesOfPooledMemoriesRestoreExactlyAndCarryNoOtherSession) {
  for (const KvDtype kv : {KvDtype::kFloat32, KvDtype::kBfloat16}) {
    const ModelConfig c = testing::SmallConfig();
    const TxlWeights w = TestWeights(c, 22);
    IncrementalModel model = GenericModel(c, w, kv);
    IncrementalModel native(c, w, at::kCPU, [&] {
      IncrementalModel::Precision p;
      p.kv_dtype = kv;
      return p;
    }());
    {
      SessionMemory noisy(c.n_layer, c.mem_len);  // fills rows, then gives them back
      FeedInChunks(model, noisy, RandomTokens(3 * c.mem_len, c.n_token, 5), 5);
    }
    SessionMemory session(c.n_layer, c.mem_len);
    FeedInChunks(model, session, RandomTokens(3, c.n_token, 6), 3);
    FeedInChunks(model, session, RandomTokens(1, c.n_token, 7), 1);
    ASSERT_TRUE(session.pooled());
    ASSERT_GT(session.capacity(), session.position()) << "some slots not written yet";
    std::string image;
    session.WriteImage(&image);
    const int64_t element = kv == KvDtype::kBfloat16 ? 2 : 4;
    const int64_t per_tensor = c.n_head * session.capacity() * c.d_head * element;
    const size_t header = image.size() - static_cast<size_t>(2 * c.n_layer * per_tensor);
    for (int64_t t = 0; t < 2 * c.n_layer; ++t) {  // [H, capacity, dh]: slots >= position are zero
      for (int64_t h = 0; h < c.n_head; ++h) {
        for (int64_t slot = session.position(); slot < session.capacity(); ++slot) {
          const size_t at = header + t * per_tensor + ((h * session.capacity() + slot) * c.d_head) * element;
          EXPECT_EQ(image.substr(at, c.d_head * element), std::string(c.d_head * element, '\0'))
              << "tensor " << t << " head " << h << " slot " << slot;
        }
      }
    }
    auto on_generic = SessionMemory::Parse(image, c, at::kCPU, model.kv_type());
    auto on_native = SessionMemory::Parse(image, c, at::kCPU, native.kv_type());
    ASSERT_TRUE(on_generic.ok() && on_native.ok());
    const auto next = RandomTokens(2 * c.mem_len, c.n_token, 8);
    SessionMemory original = std::move(session);
    const at::Tensor want = FeedInChunks(model, original, next, 1);
    EXPECT_EQ(MaxAbsDiff(FeedInChunks(model, *on_generic, next, 1), want), 0);
    EXPECT_TRUE(on_generic->pooled());
    EXPECT_LT(MaxAbsDiff(FeedInChunks(native, *on_native, next, 1), want), 1e-5);
  }
}

// A GPU sizes its pool once, from the session memory budget: sessions
// within it never make a step grow the pool.
TEST(SlotPoolTest, AReservedPoolHoldsItsBudgetWithoutGrowing) {
  const ModelConfig c = testing::SmallConfig();
  IncrementalModel model = GenericModel(c, TestWeights(c, 24));
  const int64_t full = 2 * c.n_layer * c.mem_len * c.n_head * c.d_head * 4;  // one full window
  model.ReserveSessionMemory(6 * full);
  const int64_t rows = model.pool()->rows();
  EXPECT_GE(rows, 1 + 6 * c.mem_len);
  std::vector<SessionMemory> sessions;
  for (int i = 0; i < 6; ++i) sessions.emplace_back(c.n_layer, c.mem_len);
  for (int i = 0; i < 6; ++i) FeedInChunks(model, sessions[i], RandomTokens(2 * c.mem_len, c.n_token, 60 + i), 5);
  EXPECT_EQ(model.pool()->rows(), rows);
  IncrementalModel native(c, TestWeights(c, 24), at::kCPU);
  native.ReserveSessionMemory(6 * full);  // nothing to reserve on the CPU kernels
  EXPECT_EQ(native.pool(), nullptr);
}

// A repository's versions of one shape share one session pool
// (SharedSlotPools): a rollout's new version serves from the pool reserved
// for the budget without growing it, each model's answers are those of a
// pool of its own, bit for bit, and a model of another shape keeps its own.
TEST(SlotPoolTest, ModelsOfOneShapeShareTheReservedPoolOnceTheyJoinIt) {
  const ModelConfig c = testing::SmallConfig();
  const TxlWeights w1 = TestWeights(c, 31), w2 = TestWeights(c, 32);
  SharedSlotPools pools;
  IncrementalModel v1 = GenericModel(c, w1), v2 = GenericModel(c, w2);
  v1.JoinSharedPool(pools);
  const int64_t full = 2 * c.n_layer * c.mem_len * c.n_head * c.d_head * 4;
  v1.ReserveSessionMemory(6 * full);
  const SlotPool* before = v2.pool();
  v2.JoinSharedPool(pools);
  ASSERT_EQ(v2.pool(), v1.pool());
  EXPECT_NE(before, v1.pool());
  const int64_t rows = v1.pool()->rows(), generation = v1.pool()->generation();
  IncrementalModel alone1 = GenericModel(c, w1), alone2 = GenericModel(c, w2);
  {
    // Three sessions on each version, interleaved in the one pool.
    std::vector<SessionMemory> shared, own;
    for (int i = 0; i < 12; ++i) (i < 6 ? shared : own).emplace_back(c.n_layer, c.mem_len);
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < 6; ++i) {
        const std::vector<int64_t> tokens = RandomTokens(c.mem_len - 1 + round, c.n_token, 100 * round + i);
        IncrementalModel& m = i % 2 ? v2 : v1;
        IncrementalModel& mine = i % 2 ? alone2 : alone1;
        const at::Tensor a = FeedInChunks(m, shared[i], tokens, 4);
        const at::Tensor b = FeedInChunks(mine, own[i], tokens, 4);
        EXPECT_TRUE(at::equal(a, b)) << "round " << round << " session " << i;
      }
    }
    EXPECT_EQ(v1.pool()->rows(), rows) << "six full windows fit the reserved pool";
    EXPECT_EQ(v1.pool()->generation(), generation);
  }
  EXPECT_EQ(v1.pool()->free_rows(), v1.pool()->rows() - SlotPool::kReservedRows);
  // Another shape (bfloat16 keys) keeps a pool of its own.
  IncrementalModel other = GenericModel(c, w1, KvDtype::kBfloat16);
  other.JoinSharedPool(pools);
  EXPECT_NE(other.pool(), v1.pool());
  EXPECT_EQ(pools.live(), 2);
  // The CPU kernels have no pool to share.
  IncrementalModel native(c, w1, at::kCPU);
  native.JoinSharedPool(pools);
  EXPECT_EQ(native.pool(), nullptr);
}

// Decode graphs hold their pool's addresses: a model that joins another
// pool drops the ones made on its own (a GPU would replay them on freed memory).
TEST(SlotPoolTest, JoiningAnotherPoolDropsTheGraphsMadeOnTheModelsOwn) {
  const ModelConfig c = testing::SmallConfig();
  IncrementalModel::Precision p;
  p.kernels = Kernels::kGeneric;
  p.decode_graphs = true;
  SharedSlotPools pools;
  IncrementalModel first(c, TestWeights(c, 35), at::kCPU, p), later(c, TestWeights(c, 36), at::kCPU, p);
  first.JoinSharedPool(pools);
  SessionMemory s(c.n_layer, c.mem_len);
  FeedInChunks(later, s, RandomTokens(6, c.n_token, 1), 3);
  FeedInChunks(later, s, RandomTokens(1, c.n_token, 2), 1);  // a padded pass on the model's own pool
  ASSERT_EQ(later.graphs_held(), 1);
  later.JoinSharedPool(pools);
  EXPECT_EQ(later.graphs_held(), 0);
  SessionMemory t(c.n_layer, c.mem_len);
  FeedInChunks(later, t, RandomTokens(6, c.n_token, 1), 3);
  FeedInChunks(later, t, RandomTokens(1, c.n_token, 2), 1);
  EXPECT_EQ(later.graphs_held(), 1) << "made again on the shared pool";
}

TEST(SlotPoolTest, ASharedPoolIsFreedWithItsLastHolder) {
  const ModelConfig c = testing::SmallConfig();
  SharedSlotPools pools;
  {
    IncrementalModel v1 = GenericModel(c, TestWeights(c, 33));
    v1.JoinSharedPool(pools);
    EXPECT_EQ(pools.live(), 1);
  }
  EXPECT_EQ(pools.live(), 0) << "no model or session holds it";
  IncrementalModel v2 = GenericModel(c, TestWeights(c, 34));
  const SlotPool* own = v2.pool();
  v2.JoinSharedPool(pools);
  EXPECT_EQ(v2.pool(), own) << "the shape's pool is gone: the model's own becomes it";
  EXPECT_EQ(pools.live(), 1);
}

// Rows go out lowest first, so the free ones gather at the top, where Trim
// gives them back: at least what it is asked for and half the free tail,
// never a row below a held one, keeping what the held rows hold.
TEST(SlotPoolTest, RowsAreTakenLowestFirstAndTrimGivesBackTheFreeTop) {
  SlotPool pool(2, 3, 4, at::TensorOptions().dtype(at::kFloat));
  ASSERT_EQ(pool.rows(), 64);
  const std::vector<int64_t> a = pool.Take(10, SlotPool::Admitted::kYes);
  EXPECT_EQ(a, (std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  pool.keys(1).index_fill_(0, at::tensor(a), 5.0);
  pool.Give(std::vector<int64_t>{4, 3});
  EXPECT_EQ(pool.Take(1, SlotPool::Admitted::kYes), std::vector<int64_t>{3}) << "the lowest free row";
  const int64_t generation = pool.generation();
  EXPECT_EQ(pool.Trim(pool.id_bytes()), 26 * pool.id_bytes()) << "half of the 52 free rows at the top";
  EXPECT_EQ(pool.rows(), 38);
  EXPECT_GT(pool.generation(), generation) << "the tensors were replaced";
  EXPECT_EQ(pool.Trim(std::int64_t{1} << 40), 26 * pool.id_bytes()) << "the rest of the free top";
  EXPECT_EQ(pool.rows(), 12);
  EXPECT_EQ(pool.free_rows(), 1) << "row 4, below held rows, stays";
  EXPECT_EQ(pool.Trim(std::int64_t{1} << 40), 0);
  const std::vector<int64_t> held{2, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_TRUE(pool.keys(1).index_select(0, at::tensor(held)).eq(5).all().item<bool>());
  EXPECT_TRUE(pool.keys(0).index_select(0, at::tensor(held)).eq(0).all().item<bool>());
  const std::vector<int64_t> more = pool.Take(3, SlotPool::Admitted::kYes);  // row 4, then growth
  EXPECT_EQ(more.front(), 4);
  EXPECT_TRUE(pool.keys(1).index_select(0, at::tensor(held)).eq(5).all().item<bool>()) << "kept across the growth";
}

// A repository's architectures each have a pool of their shape; with a
// limit (SharedSlotPools::Limit, the session memory budget) they hold their
// rows within it together. The start-up shape's pool is reserved for what
// is left, another shape's growth takes that pool's free tail, answers stay
// those of unbudgeted pools bit for bit, and past the budget a copy is
// refused (c10::OutOfMemoryError, RESOURCE_EXHAUSTED above the model) while
// an admitted session's step is not.
TEST(SlotPoolTest, PoolsOfSeveralShapesHoldTheirRowsWithinOneBudget) {
  const ModelConfig c = testing::SmallConfig();
  const TxlWeights w = TestWeights(c, 41);
  SharedSlotPools pools;
  IncrementalModel a = GenericModel(c, w), b = GenericModel(c, w, KvDtype::kBfloat16);
  IncrementalModel alone_a = GenericModel(c, w), alone_b = GenericModel(c, w, KvDtype::kBfloat16);
  a.JoinSharedPool(pools);
  b.JoinSharedPool(pools);
  ASSERT_NE(a.pool(), b.pool());
  const int64_t full_a = c.mem_len * a.pool()->id_bytes();  // a float32 session's full window
  const int64_t budget = 24 * full_a;
  PoolBudgetConfig limit;
  limit.limit_bytes = budget;
  pools.Limit(limit);
  a.ReserveSessionMemory(budget);  // as the server does: what the other pools leave
  EXPECT_LE(pools.held_bytes(), budget);
  EXPECT_GT(pools.held_bytes(), budget - a.pool()->id_bytes());
  const int64_t reserved_rows = a.pool()->rows();

  std::vector<SessionMemory> on_a, on_b, mine_a, mine_b;
  const auto fill = [&](IncrementalModel& m, IncrementalModel& alone, std::vector<SessionMemory>& sessions,
                        std::vector<SessionMemory>& mine, int seed) {
    sessions.emplace_back(c.n_layer, c.mem_len);
    mine.emplace_back(c.n_layer, c.mem_len);
    const std::vector<int64_t> tokens = RandomTokens(c.mem_len, c.n_token, seed);
    return at::equal(FeedInChunks(m, sessions.back(), tokens, c.mem_len),
                     FeedInChunks(alone, mine.back(), tokens, c.mem_len));
  };
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(fill(a, alone_a, on_a, mine_a, 10 + i));
  const int64_t generation = a.pool()->generation();
  // What the budget counts is what the pools hold, in whole rows.
  const auto counted = [&] { return a.pool()->held_bytes() + b.pool()->held_bytes(); };
  EXPECT_EQ(pools.held_bytes(), counted());
  for (int i = 0; i < 8; ++i) {  // more than the bfloat16 pool's 64 rows: it grows from a's free top
    EXPECT_TRUE(fill(b, alone_b, on_b, mine_b, 20 + i)) << "session " << i;
    EXPECT_LE(pools.held_bytes(), budget);
    EXPECT_EQ(pools.held_bytes(), counted());
  }
  EXPECT_LT(a.pool()->rows(), reserved_rows) << "a's free top went to b";
  EXPECT_GT(a.pool()->generation(), generation);
  for (size_t i = 0; i < on_a.size(); ++i) {  // a's sessions kept their keys
    const std::vector<int64_t> next = RandomTokens(3, c.n_token, 30 + static_cast<int>(i));
    EXPECT_TRUE(at::equal(FeedInChunks(a, on_a[i], next, 1), FeedInChunks(alone_a, mine_a[i], next, 1)));
  }

  // Float32 sessions, each after a copy of the last one (as a Score that
  // does not commit makes), until the budget refuses a copy.
  bool refused = false;
  for (int i = 0; i < 40 && !refused; ++i) {
    try {
      const SessionMemory copy = on_a.back().Copy();
    } catch (const c10::OutOfMemoryError& e) {
      refused = true;
      EXPECT_NE(std::string(e.what_without_backtrace()).find("--session_memory_budget"), std::string::npos)
          << e.what_without_backtrace();
      break;
    }
    EXPECT_TRUE(fill(a, alone_a, on_a, mine_a, 50 + i));
    ASSERT_LE(pools.held_bytes(), budget);
    EXPECT_EQ(pools.held_bytes(), counted());
  }
  ASSERT_TRUE(refused);
  const int64_t in_use = static_cast<int64_t>(on_a.size()) * full_a + static_cast<int64_t>(on_b.size()) * full_a / 2;
  EXPECT_GT(in_use + full_a + 2 * SlotPool::kReservedRows * a.pool()->id_bytes(), budget)
      << "refused only once the sessions held about the whole budget";
  // An admitted session's step is not refused there: its rows pass the budget.
  EXPECT_TRUE(fill(a, alone_a, on_a, mine_a, 98));
  EXPECT_GT(pools.held_bytes(), budget);
  EXPECT_EQ(pools.held_bytes(), counted());
  // Room for a copy again once sessions end; the others answer as before.
  for (int i = 0; i < 2; ++i) {
    on_a.erase(on_a.begin());
    mine_a.erase(mine_a.begin());
  }
  EXPECT_NO_THROW(on_a.back().Copy());
  for (size_t i = 0; i < on_b.size(); ++i) {
    const std::vector<int64_t> next = RandomTokens(2, c.n_token, 60 + static_cast<int>(i));
    EXPECT_TRUE(at::equal(FeedInChunks(b, on_b[i], next, 1), FeedInChunks(alone_b, mine_b[i], next, 1)));
  }
  on_a.clear();
  on_b.clear();
  EXPECT_EQ(pools.held_bytes(), counted());
  EXPECT_EQ(a.pool()->free_rows(), a.pool()->rows() - SlotPool::kReservedRows);
  EXPECT_EQ(b.pool()->free_rows(), b.pool()->rows() - SlotPool::kReservedRows);
}

// Past the pools' budget, once the other pools' free tops are taken, a
// session's own rows are granted, by what is needed and no more: admission
// has counted its window, and failing its step would break that promise. A
// copy, which admission has not counted, is refused there, unless offload
// lets the sessions pass the budget (grow_past). A later growth takes the
// rows given back first.
TEST(SlotPoolTest, PastTheBudgetASessionsRowsAreGrantedAndACopyIsRefusedUnlessOffloadLetsItPass) {
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat);
  constexpr SlotPool::Admitted kSession = SlotPool::Admitted::kYes, kCopy = SlotPool::Admitted::kNo;  // (a copy's)
  for (const bool grow_past : {false, true}) {
    SCOPED_TRACE(grow_past ? "grow_past" : "admission");
    SharedSlotPools pools;
    auto a = pools.Join({1, 2, 4, static_cast<int>(at::kFloat), "cpu"}, std::make_shared<SlotPool>(1, 2, 4, f32));
    auto b = pools.Join({2, 2, 4, static_cast<int>(at::kFloat), "cpu"}, std::make_shared<SlotPool>(2, 2, 4, f32));
    PoolBudgetConfig limit;
    limit.limit_bytes = a->held_bytes() + b->held_bytes();  // 62 rows each: no room to grow
    limit.grow_past = grow_past;
    pools.Limit(limit);
    ASSERT_EQ(pools.held_bytes(), limit.limit_bytes);
    const std::vector<int64_t> held_b = b->Take(30, kSession);  // b's free top: rows 32..63
    const std::vector<int64_t> first = a->Take(62, kSession);
    const std::vector<int64_t> copy = a->Take(4, kCopy);  // past a's rows: b's free top gives the room
    EXPECT_LT(b->rows(), 64) << "b's free top was trimmed";
    EXPECT_EQ(pools.held_bytes(), a->held_bytes() + b->held_bytes());
    EXPECT_LE(pools.held_bytes(), limit.limit_bytes);
    // Take b's free top until none is left above its held rows.
    const std::vector<int64_t> rest_b = b->Take(b->free_rows(), kSession);
    ASSERT_EQ(b->Trim(int64_t{1} << 40), 0);
    const int64_t a_rows = a->rows(), before = pools.held_bytes();
    const int64_t past = 3 + a->free_rows();  // three rows more than a has
    if (!grow_past) {
      EXPECT_THROW(a->Take(past, kCopy), c10::OutOfMemoryError) << "a copy is refused";
      EXPECT_EQ(a->rows(), a_rows);
      EXPECT_EQ(pools.held_bytes(), before);
    }
    const std::vector<int64_t> over = a->Take(past, grow_past ? kCopy : kSession);
    EXPECT_EQ(over.size(), static_cast<size_t>(past));
    EXPECT_EQ(a->rows(), a_rows + 3) << "grown by what was needed, not doubled";
    EXPECT_EQ(pools.held_bytes(), before + 3 * a->id_bytes());
    EXPECT_GT(pools.held_bytes(), limit.limit_bytes);
    a->Give(over);
    EXPECT_EQ(b->Take(2, kCopy).size(), 2u);
    EXPECT_LE(pools.held_bytes(), limit.limit_bytes) << "b's growth took a's freed top: back within the limit";
    EXPECT_EQ(pools.held_bytes(), a->held_bytes() + b->held_bytes());
  }
}

// The ATen ops this thread dispatches (views and nested calls included):
// what a GPU would launch, or more; and of them, the copies into the pool.
thread_local int64_t t_ops = 0, t_index_copies = 0, t_layer_norms = 0, t_products = 0;
std::unique_ptr<at::ObserverContext> CountOp(const at::RecordFunction& fn) {
  ++t_ops;
  const std::string name = fn.name();
  if (name == "aten::index_copy_") ++t_index_copies;
  if (name == "aten::layer_norm") ++t_layer_norms;
  if (name == "aten::linear" || name == "aten::addmm" || name == "aten::_addmm_activation" || name == "aten::mm")
    ++t_products;
  return nullptr;
}

// The point of the pool: a decode step's ops per layer do not grow with the
// batch (the per-session copies they replaced were about ten per session per
// layer). What does grow is per session once per step (its hidden row).
// The ATen ops one generic decode step of `batch` sessions dispatches, after a warm step.
int64_t DecodeStepOps(IncrementalModel& model, const ModelConfig& c, int batch) {
  std::vector<SessionMemory> sessions;
  for (int b = 0; b < batch; ++b) sessions.emplace_back(c.n_layer, c.mem_len);
  for (int b = 0; b < batch; ++b) FeedInChunks(model, sessions[b], RandomTokens(5 + b % 3, c.n_token, b), 8);
  std::vector<StepInput> inputs;
  for (int b = 0; b < batch; ++b) inputs.push_back(Row(&sessions[b], {static_cast<int64_t>(b % c.n_token)}));
  model.Step(absl::MakeSpan(inputs));  // warm: any growth happens here
  inputs.clear();
  for (int b = 0; b < batch; ++b) inputs.push_back(Row(&sessions[b], {static_cast<int64_t>((b + 1) % c.n_token)}));
  const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&CountOp));
  t_ops = t_index_copies = 0;
  model.Step(absl::MakeSpan(inputs));
  at::removeCallback(handle);
  return t_ops;
}

int64_t MixedStepOps(IncrementalModel& model, const ModelConfig& c) {
  std::vector<SessionMemory> sessions;
  for (int b = 0; b < 8; ++b) sessions.emplace_back(c.n_layer, c.mem_len);
  for (int b = 0; b < 8; ++b) FeedInChunks(model, sessions[b], RandomTokens(2 * c.mem_len, c.n_token, 40 + b), 9);
  auto step = [&](int round) {
    std::vector<StepInput> inputs;
    for (int b = 0; b < 8; ++b) {
      std::vector<int64_t> toks = {static_cast<int64_t>((b + round) % c.n_token)};
      if (b == 3) toks.push_back((b + round + 1) % c.n_token);
      inputs.push_back(Row(&sessions[b], toks));
    }
    model.Step(absl::MakeSpan(inputs));
  };
  step(0);  // warm
  const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&CountOp));
  t_ops = 0;
  step(1);
  at::removeCallback(handle);
  return t_ops;
}

// Batches of 2 and 32 sessions (products by SkinnyProduct), and of 33 and 40
// (libtorch's products): within each pair, fewer extra ops than one per
// extra session and layer.
void ExpectTheSameOpsPerLayerForAnyBatch(IncrementalModel& model, const ModelConfig& c) {
  static_assert(kSkinnyMaxRows == 32, "the pairs' regimes");
  for (const auto& [few, more] : {std::pair{2, 32}, std::pair{33, 40}}) {
    const int64_t a = DecodeStepOps(model, c, few), b = DecodeStepOps(model, c, more);
    std::cout << "generic decode step, " << c.n_layer << " layers: " << a << " ops at batch " << few << ", " << b
              << " at batch " << more << "\n";
    ASSERT_GT(a, 10 * c.n_layer) << "the counter saw the step";
    EXPECT_LT(b - a, (more - few) * c.n_layer) << "ops per session per layer, batches " << few << " and " << more;
  }
}

TEST(SlotPoolTest, ADecodeStepDispatchesTheSameOpsPerLayerForAnyBatch) {
  ModelConfig c = testing::SmallConfig();
  c.n_layer = 6;
  IncrementalModel model = GenericModel(c, TestWeights(c, 23));
  ExpectTheSameOpsPerLayerForAnyBatch(model, c);
}

// SplitDecodeAttention replaces the attention's gathers, products, mask and
// softmax (each a kernel on a GPU) with its own two launches: a decode
// step's ops per layer fall by more than half (measured: about 180 to 78).
TEST(SlotPoolTest, TheSplitDecodeAttentionDispatchesUnderHalfTheOps) {
  ModelConfig c = testing::SmallConfig();
  c.n_layer = 6;
  IncrementalModel split = GenericModel(c, TestWeights(c, 23));
  IncrementalModel tensor_ops = GenericModel(c, TestWeights(c, 23), KvDtype::kFloat32, false);
  const int64_t with = DecodeStepOps(split, c, 4), without = DecodeStepOps(tensor_ops, c, 4);
  std::cout << "generic decode step, " << c.n_layer << " layers, 4 sessions: " << with << " ops split, " << without
            << " with tensor ops\n";
  ASSERT_GT(with, 10 * c.n_layer) << "the counter saw the step";
  EXPECT_LT(2 * with, without);
}

// The split attention's kernel stores each session's new key and value in
// the pool itself (SplitDecodeArgs::write_rows): a decode step copies
// nothing into the pool, where the tensor ops copy each layer's keys and
// values (two kernels a layer on a GPU). Each step's results match the
// tensor ops', and so do the next steps', which attend the stored keys.
TEST(SlotPoolTest, TheSplitDecodeAttentionStoresTheNewKeysItself) {
  ModelConfig c = testing::SmallConfig();
  c.n_layer = 4;
  for (const KvDtype kv : {KvDtype::kFloat32, KvDtype::kBfloat16}) {
    SCOPED_TRACE(kv == KvDtype::kFloat32 ? "float32 memories" : "bfloat16 memories");
    IncrementalModel split = GenericModel(c, TestWeights(c, 23), kv);
    IncrementalModel tensor_ops = GenericModel(c, TestWeights(c, 23), kv, false);
    DecodeStepOps(tensor_ops, c, 3);
    EXPECT_EQ(t_index_copies, 2 * c.n_layer) << "the tensor ops' step (the counter saw it)";
    DecodeStepOps(split, c, 3);
    EXPECT_EQ(t_index_copies, 0);

    std::vector<SessionMemory> a, b;
    for (int s = 0; s < 3; ++s) {
      a.emplace_back(c.n_layer, c.mem_len);
      b.emplace_back(c.n_layer, c.mem_len);
      const std::vector<int64_t> prompt = RandomTokens(4 + s, c.n_token, 80 + s);
      FeedInChunks(split, a.back(), prompt, 8);
      FeedInChunks(tensor_ops, b.back(), prompt, 8);
    }
    double worst = 0;
    for (int step = 0; step < 2 * c.mem_len; ++step) {  // past a full window: the ring's slots reused
      std::vector<StepInput> in_a, in_b;
      for (int s = 0; s < 3; ++s) {
        const std::vector<int64_t> token = {(step * 7 + s) % c.n_token};
        in_a.push_back(Row(&a[s], token));
        in_b.push_back(Row(&b[s], token));
      }
      const at::Tensor got = split.Step(absl::MakeSpan(in_a)), want = tensor_ops.Step(absl::MakeSpan(in_b));
      worst = std::max(worst, MaxAbsDiff(got, want));
    }
    std::cout << "split against tensor ops, " << 2 * c.mem_len << " decode steps: " << worst << "\n";
    // The hidden states (about 1 in size), summed in another order. With
    // bfloat16 memories a key whose float32 value the two orders put on
    // either side of a rounding boundary is stored one bfloat16 step apart
    // (about 0.4%), and later steps differ by about 1e-4 (2.3e-4 measured,
    // the same before the kernel stored the keys).
    EXPECT_LT(worst, kv == KvDtype::kFloat32 ? 1e-5 : 1e-3);
  }
}

// A post-norm model's residual add and layer norm as one kernel
// (ResidualLayerNorm) on the generic path: a decode step and a pass of
// several tokens give what libtorch's add and layer_norm give, and no
// layer_norm is dispatched (two a layer on the tensor ops). A pre-norm
// model keeps the tensor ops (its norm's input is not a sum).
TEST(SlotPoolTest, TheResidualAddsFuseWithTheirLayerNorms) {
  ModelConfig c = testing::SmallConfig();
  c.n_layer = 4;
  const TxlWeights w = TestWeights(c, 29);
  std::vector<at::Tensor> results[2];
  int64_t norms[2] = {0, 0};
  for (const bool fused : {false, true}) {
    IncrementalModel::Precision p;
    p.kernels = Kernels::kGeneric;
    p.fused_add_norm = fused;
    IncrementalModel model(c, w, at::kCPU, p);
    EXPECT_EQ(model.KernelPath().find("residual adds fused") != std::string::npos, fused) << model.KernelPath();
    SessionMemory one(c.n_layer, c.mem_len), two(c.n_layer, c.mem_len);
    for (int step = 0; step < 5; ++step) {
      // A pass, three decode steps, and a mixed step (one session feeding 2).
      const int64_t n = step == 0 ? 9 : 1;
      std::vector<StepInput> in = {Row(&one, RandomTokens(n, c.n_token, 60 + step)),
                                   Row(&two, RandomTokens(n + (step == 4), c.n_token, 70 + step))};
      const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&CountOp));
      t_layer_norms = 0;
      results[fused].push_back(model.Step(absl::MakeSpan(in)));
      at::removeCallback(handle);
      norms[fused] += t_layer_norms;
    }
  }
  EXPECT_GE(norms[0], 5 * 2 * c.n_layer) << "the tensor ops' steps (the counter saw them)";
  EXPECT_EQ(norms[1], 0);
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i) EXPECT_LT(MaxAbsDiff(results[0][i], results[1][i]), 1e-5) << i;

  c.pre_lnorm = true;
  IncrementalModel::Precision p;
  p.kernels = Kernels::kGeneric;
  const IncrementalModel pre(c, TestWeights(c, 29), at::kCPU, p);
  EXPECT_EQ(pre.KernelPath().find("residual adds fused"), std::string::npos) << pre.KernelPath();
}

// The generic path's products of at most Precision::skinny_max_rows rows
// (kSkinnyMaxRows by default) by SkinnyProduct (its CPU form here, the CUDA
// kernel on a GPU): a step of that many rows or fewer dispatches no product
// of libtorch's, four a layer with 0; more rows keep libtorch's (on a GPU,
// nine sessions take two of the kernel's groups of eight rows; the CPU
// form's sums are the same in any group). Each step's results
// match libtorch's products' to float32's rounding (the same sums in
// another order), and so do the next steps'.
TEST(SlotPoolTest, SmallStepsMultiplyBySkinnyProduct) {
  ModelConfig c = testing::SmallConfig();
  c.n_layer = 3;
  const TxlWeights w = TestWeights(c, 31);
  // A 12-token pass of three sessions (36 rows), decode steps of 3, 3, 9, 33 and 3 sessions.
  const int batches[] = {3, 3, 3, 9, 33, 3};
  const int64_t limits[] = {0, 8, kSkinnyMaxRows};
  std::vector<at::Tensor> results[3];
  std::vector<int64_t> products[3];
  for (int i = 0; i < 3; ++i) {
    IncrementalModel::Precision p;
    p.kernels = Kernels::kGeneric;
    p.skinny_max_rows = limits[i];
    IncrementalModel model(c, w, at::kCPU, p);
    EXPECT_EQ(model.KernelPath().find("by SkinnyProduct") != std::string::npos, limits[i] > 0) << model.KernelPath();
    std::vector<SessionMemory> sessions;
    for (int b = 0; b < 33; ++b) sessions.emplace_back(c.n_layer, c.mem_len);
    for (int step = 0; step < 6; ++step) {
      const int64_t n = step == 0 ? 12 : 1;
      std::vector<StepInput> in;
      for (int b = 0; b < batches[step]; ++b) {
        in.push_back(Row(&sessions[b], RandomTokens(n, c.n_token, 90 + step * 33 + b)));
      }
      const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&CountOp));
      t_products = 0;
      results[i].push_back(model.Step(absl::MakeSpan(in)));
      at::removeCallback(handle);
      products[i].push_back(t_products);
    }
  }
  for (int i = 0; i < 3; ++i) {
    for (size_t step = 0; step < products[i].size(); ++step) {
      SCOPED_TRACE(::testing::Message() << "skinny_max_rows " << limits[i] << ", step " << step);
      const int64_t rows = batches[step] * (step == 0 ? 12 : 1);
      if (rows > limits[i]) {
        EXPECT_GE(products[i][step], 4 * c.n_layer) << rows << " rows: libtorch's (the counter saw them)";
      } else {
        EXPECT_EQ(products[i][step], 0) << rows << " rows: SkinnyProduct's";
      }
      if (i > 0) {
        EXPECT_LT(MaxAbsDiff(results[0][step], results[i][step]), 1e-5);
      }
    }
  }
}

TEST(SlotPoolTest, RefusesSkinnyMaxRowsOutOfRange) {
  const ModelConfig c = testing::SmallConfig();
  for (const int64_t rows : {int64_t{-1}, kSkinnyMaxRows + 1}) {
    IncrementalModel::Precision p;
    p.kernels = Kernels::kGeneric;
    p.skinny_max_rows = rows;
    try {
      IncrementalModel model(c, TestWeights(c, 31), at::kCPU, p);
      ADD_FAILURE() << "skinny_max_rows " << rows << " was taken";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("skinny_max_rows: must be 0 to 32"), std::string::npos) << e.what();
    }
  }
}

// The same for the tensor-op attention (prefills' path, and decode steps with
// split_decode_attention off).
TEST(SlotPoolTest, ADecodeStepDispatchesTheSameOpsPerLayerForAnyBatchWithTensorOps) {
  ModelConfig c = testing::SmallConfig();
  c.n_layer = 6;
  IncrementalModel model = GenericModel(c, TestWeights(c, 23), KvDtype::kFloat32, false);
  ExpectTheSameOpsPerLayerForAnyBatch(model, c);
}

TEST(TrainingFormTest, SameLengthFalseSeesTheWholeMemory) {
  ModelConfig c = testing::SmallConfig();
  c.same_length = false;
  ModelConfig same = c;
  same.same_length = true;
  const TxlWeights w = TestWeights(c, 2);
  at::Tensor tokens = at::tensor(RandomTokens(10, c.n_token, 5)).view({10, 1});
  // Without memory and qlen <= mem_len, both masks are the causal mask.
  SegmentOutput a = TrainingForward(c, w, tokens, {}, false);
  SegmentOutput b = TrainingForward(same, w, tokens, {}, false);
  EXPECT_LT(MaxAbsDiff(a.hidden, b.hidden), 1e-6);
  // With a full memory, same_length=false lets later queries see more keys.
  SegmentOutput a2 = TrainingForward(c, w, tokens, a.mems, false);
  SegmentOutput b2 = TrainingForward(same, w, tokens, b.mems, false);
  EXPECT_LT(MaxAbsDiff(a2.hidden[0], b2.hidden[0]), 1e-6);  // the first query sees mem_len keys either way
  EXPECT_GT(MaxAbsDiff(a2.hidden[9], b2.hidden[9]), 1e-4);
}

TEST(TrainingFormTest, DropoutOnlyWhenTrainingAndNoGradientThroughMems) {
  ModelConfig c = testing::SmallConfig();
  c.dropout = 0.3;
  c.dropatt = 0.2;
  TxlWeights w = TestWeights(c, 2);
  for (at::Tensor& p : w.Parameters(c)) p.requires_grad_(true);
  at::Tensor tokens = at::tensor(RandomTokens(16, c.n_token, 5)).view({8, 2});
  SegmentOutput e1 = TrainingForward(c, w, tokens, {}, false);
  SegmentOutput e2 = TrainingForward(c, w, tokens, {}, false);
  EXPECT_TRUE(at::equal(e1.hidden, e2.hidden));
  SegmentOutput t1 = TrainingForward(c, w, tokens, {}, true);
  SegmentOutput t2 = TrainingForward(c, w, tokens, {}, true);
  EXPECT_FALSE(at::equal(t1.hidden, t2.hidden));
  EXPECT_TRUE(t1.hidden.requires_grad());
  ASSERT_EQ(t1.mems.size(), static_cast<size_t>(c.n_layer));
  for (const at::Tensor& m : t1.mems) EXPECT_FALSE(m.requires_grad());
}

TEST(WeightsTest, TiedTensorsAreOneParameter) {
  ModelConfig c = testing::Variants()[2].config;  // tie_weight, tie_projs [F, T, T]
  TxlWeights w = InitWeights(c, 1);
  EXPECT_TRUE(w.out_w[1].is_same(w.emb_layers[1]));
  EXPECT_TRUE(w.out_projs[2].is_same(w.emb_projs[2]));
  EXPECT_FALSE(w.out_projs[0].is_same(w.emb_projs[0]));
  size_t named = 0;
  for (const auto& n : w.NamedTensors(c)) named += n.is_buffer ? 0 : 1;
  // 3 out_layers weights and 2 out_projs are tied, so 5 names share tensors.
  EXPECT_EQ(w.Parameters(c).size(), named - 5);
}

}  // namespace
}  // namespace txl
