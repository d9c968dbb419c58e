// A generic model whose CUDA launches run our kernels' sources on the block
// emulator (IncrementalModel::Precision::emulate_cuda_kernels; the launches
// of cuda_launch_emulated.cc), against the same model running the kernels'
// CPU forms. The CPU forms check the kernels' arithmetic; this checks what
// only a GPU's run took before: the model's arguments to each launch (its
// pointers, strides and types, the split attention's per-step counters)
// and the kernels' indexing over the model's own tensors, through passes,
// decode steps of a few sessions and of more, a full window
// and past it, with and without the padded graph passes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "model/kernels/cpu_isa.h"
#include "model/net/incremental.h"
#include "tests/model/model_fixture.h"

namespace txl {
namespace {

using testing::FeedInChunks;
using testing::MaxAbsDiff;
using testing::RandomTokens;
using testing::Row;
using testing::TestWeights;

struct Mode {
  WeightDtype dtype;
  KvDtype kv;
  bool graphs;
  std::string Name() const {
    return std::string(dtype == WeightDtype::kBfloat16 ? "bfloat16 weights" : "float32 weights") +
           (kv == KvDtype::kBfloat16 ? ", bfloat16 memories" : ", float32 memories") +
           (graphs ? ", padded graph passes" : "");
  }
};

IncrementalModel Model(const ModelConfig& c, const TxlWeights& w, const Mode& mode, bool emulate) {
  IncrementalModel::Precision p;
  p.kernels = Kernels::kGeneric;
  p.dtype = mode.dtype;
  p.kv_dtype = mode.kv;
  p.decode_graphs = mode.graphs;
  p.emulate_cuda_kernels = emulate;
  return IncrementalModel(c, w, at::kCPU, p);
}

// What a comparison feeds: prompts of `prompt + 2 s` tokens (session s of
// 9) in passes of `chunk`, then `steps` decode steps of 3 sessions
// (products of 3 rows: SkinnyProduct), every fifth of all 9 (SkinnyProduct
// in two groups of rows), and at step 7 one session feeding 3 tokens.
struct Feed {
  int64_t prompt = 3, chunk = 8;
  int steps = 0;
};

// Each step's hidden states on both models, within `bound`; returns the
// largest difference.
double LargestDifference(const ModelConfig& c, const Mode& mode, const Feed& feed, double bound) {
  const TxlWeights w = TestWeights(c, 41);
  IncrementalModel cpu = Model(c, w, mode, false), emulated = Model(c, w, mode, true);
  EXPECT_NE(emulated.KernelPath().find("CUDA kernels launched on the CPU"), std::string::npos) << emulated.KernelPath();
  constexpr int kSessions = 9;
  std::vector<SessionMemory> a, b;
  for (int s = 0; s < kSessions; ++s) {
    a.emplace_back(c.n_layer, c.mem_len);
    b.emplace_back(c.n_layer, c.mem_len);
    const std::vector<int64_t> prompt = RandomTokens(feed.prompt + 2 * s, c.n_token, 100 + s);
    FeedInChunks(cpu, a.back(), prompt, feed.chunk);
    FeedInChunks(emulated, b.back(), prompt, feed.chunk);
  }
  double worst = 0;
  for (int step = 0; step < feed.steps; ++step) {
    const int batch = step % 5 == 4 ? kSessions : 3;
    std::vector<StepInput> in_a, in_b;
    for (int s = 0; s < batch; ++s) {
      const std::vector<int64_t> tokens = RandomTokens(step == 7 && s == 1 ? 3 : 1, c.n_token, 1000 * step + s);
      in_a.push_back(Row(&a[s], tokens));
      in_b.push_back(Row(&b[s], tokens));
    }
    const at::Tensor want = cpu.Step(absl::MakeSpan(in_a)), got = emulated.Step(absl::MakeSpan(in_b));
    EXPECT_EQ(got.sizes(), want.sizes()) << "step " << step;
    if (got.sizes() != want.sizes()) return INFINITY;
    const double diff = MaxAbsDiff(got, want);
    worst = std::max(worst, diff);
    EXPECT_LT(diff, bound) << "step " << step;
    if (diff >= bound) return diff;
  }
  return worst;
}

// The hidden states (about 1 in size): float32 sums in other orders (1.1e-6
// measured). With bfloat16 memories, a key the two orders put on either
// side of a rounding boundary is stored one bfloat16 step apart (about
// 0.4%), and later steps move by about 1e-4 (as the split attention against
// the tensor ops, SlotPoolTest). With bfloat16 activations every product's
// output is rounded so: 4.4e-3 measured.
double Bound(const Mode& mode) {
  return mode.dtype == WeightDtype::kBfloat16 ? 2e-2 : mode.kv == KvDtype::kBfloat16 ? 1e-3 : 1e-5;
}

void Check(const ModelConfig& c, const Mode& mode, const Feed& feed) {
  SCOPED_TRACE(mode.Name());
  const double worst = LargestDifference(c, mode, feed, Bound(mode));
  std::cout << mode.Name() << ", window " << c.mem_len << ": the emulated kernels against their CPU forms, "
            << feed.steps << " steps: largest difference " << worst << "\n";
}

// The test model past two full windows (of 12 keys: one chunk of the split
// attention each), in float32, and with bfloat16 memories and the padded
// graph passes.
TEST(EmulatedDeviceTest, TheModelsLaunchesMatchTheCpuForms) {
  const ModelConfig c = testing::SmallConfig();
  const IncrementalModel emulated =
      Model(c, TestWeights(c, 41), Mode{WeightDtype::kFloat32, KvDtype::kFloat32, false}, true);
  EXPECT_NE(emulated.KernelPath().find("decode attention split over key chunks (CUDA kernels)"), std::string::npos)
      << emulated.KernelPath();
  const Feed feed{3, 8, 2 * static_cast<int>(c.mem_len) + 3};
  Check(c, Mode{WeightDtype::kFloat32, KvDtype::kFloat32, false}, feed);
  Check(c, Mode{WeightDtype::kFloat32, KvDtype::kBfloat16, true}, feed);
}

// bfloat16 weights, memories and activations: every kernel's bfloat16
// inputs and outputs.
TEST(EmulatedDeviceTest, Bfloat16ActivationsLaunchesMatchTheCpuForms) {
  if (!CpuHasBf16Products()) GTEST_SKIP() << "bfloat16 activations need bfloat16 products: AVX-512-BF16 or AMX";
  const ModelConfig c = testing::SmallConfig();
  Check(c, Mode{WeightDtype::kBfloat16, KvDtype::kBfloat16, true}, Feed{3, 8, 2 * static_cast<int>(c.mem_len) + 3});
}

// A window of 150 keys: three chunks of the split attention a session, so
// that the last block of each (session, head) combines the others'
// partials (over the model's own partial and counter tensors).
TEST(EmulatedDeviceTest, AWindowOfSeveralChunksMatchesTheCpuForms) {
  ModelConfig c = testing::SmallConfig();
  c.n_layer = 2;
  c.mem_len = 150;
  const Feed feed{150, 40, 8};
  Check(c, Mode{WeightDtype::kFloat32, KvDtype::kFloat32, false}, feed);
  Check(c, Mode{WeightDtype::kFloat32, KvDtype::kBfloat16, true}, feed);
}

// The model's variants (pre-norm layers, whose norms stay libtorch's; an
// adaptive softmax; clamped distances, whose position table is shorter
// than the window; untied biases; a projected embedding), float32, past
// one full window.
TEST(EmulatedDeviceTest, EveryVariantsLaunchesMatchTheCpuForms) {
  for (const testing::NamedConfig& v : testing::Variants()) {
    if (v.name == "PostNorm") continue;  // the tests above
    SCOPED_TRACE(v.name);
    Check(v.config, Mode{WeightDtype::kFloat32, KvDtype::kFloat32, false},
          Feed{3, 8, static_cast<int>(v.config.mem_len) + 3});
  }
}

}  // namespace
}  // namespace txl
