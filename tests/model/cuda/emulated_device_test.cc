// A generic model whose CUDA launches run our kernels' sources on the block
// emulator (IncrementalModel::Precision::emulate_cuda_kernels; the launches
// of cuda_launch_emulated.cc), against the same model running the kernels'
// CPU forms. The CPU forms check the kernels' arithmetic; this checks what
// only a GPU's run took before: the model's arguments to each launch (its
// pointers, strides and types, the split attention's per-step counters)
// and the kernels' indexing over the model's own tensors, through passes,
// decode steps of a few sessions (SkinnyProduct) and of many, a full window
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

// Prompts in passes of up to 8 tokens, then `steps` decode steps of 3
// sessions (products of 3 rows: SkinnyProduct), every fifth of all 9
// (libtorch's products), and at step 7 one session feeding 3 tokens: each
// step's hidden states on both models, within `bound`; returns the largest
// difference.
double LargestDifference(const ModelConfig& c, const Mode& mode, int steps, double bound) {
  const TxlWeights w = TestWeights(c, 41);
  IncrementalModel cpu = Model(c, w, mode, false), emulated = Model(c, w, mode, true);
  EXPECT_NE(emulated.KernelPath().find("CUDA kernels launched on the CPU"), std::string::npos) << emulated.KernelPath();
  constexpr int kSessions = 9;
  std::vector<SessionMemory> a, b;
  for (int s = 0; s < kSessions; ++s) {
    a.emplace_back(c.n_layer, c.mem_len);
    b.emplace_back(c.n_layer, c.mem_len);
    const std::vector<int64_t> prompt = RandomTokens(3 + 2 * s, c.n_token, 100 + s);
    FeedInChunks(cpu, a.back(), prompt, 8);
    FeedInChunks(emulated, b.back(), prompt, 8);
  }
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
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

// The base test model past two full windows, in float32, with bfloat16
// memories and the padded graph passes, and with bfloat16 weights,
// memories and activations (every kernel's bfloat16 inputs and outputs).
TEST(EmulatedDeviceTest, TheModelsLaunchesMatchTheCpuForms) {
  const ModelConfig c = testing::SmallConfig();
  {
    const IncrementalModel emulated =
        Model(c, TestWeights(c, 41), Mode{WeightDtype::kFloat32, KvDtype::kFloat32, false}, true);
    EXPECT_NE(emulated.KernelPath().find("decode attention split over key chunks (CUDA kernels)"), std::string::npos)
        << emulated.KernelPath();
  }
  std::vector<Mode> modes = {{WeightDtype::kFloat32, KvDtype::kFloat32, false},
                             {WeightDtype::kFloat32, KvDtype::kBfloat16, true}};
  // bfloat16 activations need bfloat16 products: on a CPU, AVX-512-BF16 or AMX.
  if (CpuHasBf16Products()) modes.push_back({WeightDtype::kBfloat16, KvDtype::kBfloat16, true});
  for (const Mode& mode : modes) {
    SCOPED_TRACE(mode.Name());
    // The hidden states (about 1 in size): float32 sums in other orders
    // (1.1e-6 measured). With bfloat16 memories, a key the two orders put
    // on either side of a rounding boundary is stored one bfloat16 step
    // apart (about 0.4%), and later steps move by about 1e-4 (as the split
    // attention against the tensor ops, SlotPoolTest). With bfloat16
    // activations every product's output is rounded so: 4.4e-3 measured.
    const double bound = mode.dtype == WeightDtype::kBfloat16 ? 2e-2 : mode.kv == KvDtype::kBfloat16 ? 1e-3 : 1e-5;
    const int steps = 2 * c.mem_len + 3;
    const double worst = LargestDifference(c, mode, steps, bound);
    std::cout << mode.Name() << ": the emulated kernels against their CPU forms, " << steps
              << " steps: largest difference " << worst << "\n";
  }
}

// The model's variants (pre-norm layers, whose norms stay libtorch's; an
// adaptive softmax; clamped distances, whose position table is shorter
// than the window; untied biases; a projected embedding), float32, past
// one full window.
TEST(EmulatedDeviceTest, EveryVariantsLaunchesMatchTheCpuForms) {
  for (const testing::NamedConfig& v : testing::Variants()) {
    if (v.name == "PostNorm") continue;  // the test above
    SCOPED_TRACE(v.name);
    const double worst =
        LargestDifference(v.config, Mode{WeightDtype::kFloat32, KvDtype::kFloat32, false}, v.config.mem_len + 3, 1e-5);
    std::cout << v.name << ": largest difference " << worst << "\n";
  }
}

}  // namespace
}  // namespace txl
