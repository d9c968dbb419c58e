// Tiny random-weight models made by the tests themselves.
#ifndef TXL_TESTS_MODEL_MODEL_FIXTURE_H_
#define TXL_TESTS_MODEL_MODEL_FIXTURE_H_

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/net/incremental.h"
#include "model/net/txl_math.h"
#include "model/net/weights.h"
#include "model/step.h"

namespace txl::testing {

struct NamedConfig {
  std::string name;
  ModelConfig config;
};
inline void PrintTo(const NamedConfig& c, std::ostream* os) { *os << c.name; }

// A log-prob row as a list in the sampler's order: the higher log-prob
// first, ties to the lower id.
inline TokenList SortedTokens(const float* row, int64_t n) {
  TokenList all;
  for (int64_t t = 0; t < n; ++t) all.emplace_back(static_cast<int>(t), row[t]);
  std::sort(all.begin(), all.end(), Likelier);
  return all;
}

inline ModelConfig SmallConfig() {
  ModelConfig c;
  c.n_token = 48;
  c.n_layer = 3;
  c.n_head = 3;
  c.d_model = 32;
  c.d_head = 8;
  c.d_inner = 64;
  c.mem_len = 12;
  return c;
}

// The variants the issue names: post-norm, pre-norm, adaptive softmax with
// two clusters and div_val 2, clamp_len < mem_len, untied biases, and a
// projected embedding.
inline std::vector<NamedConfig> Variants() {
  std::vector<NamedConfig> out;
  out.push_back({"PostNorm", SmallConfig()});
  ModelConfig pre = SmallConfig();
  pre.pre_lnorm = true;
  out.push_back({"PreNorm", pre});
  ModelConfig adaptive = SmallConfig();
  adaptive.cutoffs = {12, 24};
  adaptive.div_val = 2;
  adaptive.tie_projs = {false, true, true};
  out.push_back({"AdaptiveDiv2", adaptive});
  ModelConfig clamp = SmallConfig();
  clamp.clamp_len = 5;
  out.push_back({"Clamp", clamp});
  ModelConfig untied = SmallConfig();
  untied.untie_r = true;
  out.push_back({"UntiedBiases", untied});
  ModelConfig proj = SmallConfig();
  proj.d_embed = 24;
  proj.cutoffs = {20};
  proj.tail_cluster_order = TailClusterOrder::kSequential;
  out.push_back({"ProjectedEmbedding", proj});
  return out;
}

// The kernels the model tests run on: the CPU's own (the default) or, with
// TXL_TEST_KERNELS=generic, libtorch's ops as a GPU runs them. CTest runs
// the incremental tests both ways (tests/CMakeLists.txt), so the GPU's code
// is proven on a CPU.
inline Kernels TestKernels() {
  const char* name = std::getenv("TXL_TEST_KERNELS");
  return name != nullptr && std::strcmp(name, "generic") == 0 ? Kernels::kGeneric : Kernels::kAuto;
}
inline IncrementalModel::Precision TestPrecision() {
  IncrementalModel::Precision p;
  p.kernels = TestKernels();
  return p;
}

// Larger-than-default init so that attention patterns and memory matter.
inline TxlWeights TestWeights(const ModelConfig& c, uint64_t seed) {
  return InitWeights(c, seed, /*init_std=*/0.15, /*proj_init_std=*/0.15);
}

inline std::vector<int64_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  std::vector<int64_t> out(n);
  for (auto& t : out) t = dist(gen);
  return out;
}

// A step input: `tokens` for `memory`.
inline StepInput Row(SessionMemory* memory, const std::vector<int64_t>& tokens) {
  StepInput in;
  in.session = memory;
  in.tokens.assign(tokens.begin(), tokens.end());
  return in;
}

// Feeds `tokens` into `memory` in chunks and returns the log-prob rows
// [n, n_token] after every token.
inline at::Tensor FeedInChunks(IncrementalModel& model, SessionMemory& memory, const std::vector<int64_t>& tokens,
                               int64_t chunk) {
  std::vector<at::Tensor> rows;
  for (size_t s = 0; s < tokens.size(); s += chunk) {
    const StepInput in =
        Row(&memory, std::vector<int64_t>(tokens.begin() + s, tokens.begin() + std::min(tokens.size(), s + chunk)));
    at::Tensor hidden = model.Step(absl::MakeConstSpan(&in, 1));
    rows.push_back(LogProbs(model.config(), model.weights(), hidden));
  }
  return at::cat(rows, 0);
}

inline double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace txl::testing

#endif  // TXL_TESTS_MODEL_MODEL_FIXTURE_H_
