// engine_bench's parts (engine_bench.cc says what it measures, and holds its
// flags, main and output): the rows it reports, the helpers every group uses,
// and Bench, the model under measurement, whose methods are defined by topic:
//   engine_bench_steps.cc      timed engine steps: sessions, readouts, scoring
//   engine_bench_baselines.cc  what a step is compared with: the original code's
//                              ways of serving (hidden-state memory, recompute)
//                              and the bandwidth floor
//   engine_bench_groups.cc     Run: the groups P5/P3, P1/P1f, S and P2, and the
//                              row builders
//   engine_bench_vocab.cc      group W: the output side of a large vocabulary
//   engine_bench_precision.cc  group Q: reduced precision against float32
#ifndef TXL_BENCH_ENGINE_BENCH_H_
#define TXL_BENCH_ENGINE_BENCH_H_

#include <ATen/ATen.h>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "model/net/language_model.h"
#include "model/net/weights.h"
#include "nlohmann/json.hpp"
#include "server/sampling/sampler.h"

namespace engine_bench {

using Clock = std::chrono::steady_clock;
using txl::LanguageModel;
using txl::SessionState;
using txl::StepInput;
using txl::StepOutput;

[[noreturn]] inline void Fail(const std::string& what) {
  std::cerr << "engine_bench: " << what << "\n";
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Fail(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Resident bytes, after the allocator returns its free pages: what is live
// (sessions, model, and the pages their fragmentation pins), not what earlier
// steps' freed scratch left mapped (which made P5 vary 0.7-1.1 between runs).
inline int64_t RssBytes() {
  malloc_trim(0);
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

struct Sizes {
  int64_t mem = 800;                           // memory positions for P1 / P3 / P5
  std::vector<int64_t> windows = {800, 3800};  // attention windows for P2
  std::vector<int64_t> w_mems = {800, 1600};   // memories for W1 (W3: the first)
  int sessions = 32;
  int reps = 5;
  // Steps per timed batch.
  int engine_batch = 20, baseline_batch = 3, multi_batch = 5;
};

// One measured pair; per-repetition times are seconds per unit (step or token).
struct Row {
  std::string id, measurement, a_name, b_name, unit;
  std::string b_unit;  // when B is in another unit than A
  double a = 0, b = 0, ratio = 0, target = 0;
  bool at_least = true;  // target is a lower bound on the ratio
  std::vector<double> a_reps, b_reps;
  nlohmann::json extra = nlohmann::json::object();
  bool met() const { return at_least ? ratio >= target : ratio <= target; }
};

// Runs A and B alternately, `reps` times each; returns the per-rep values.
inline void Interleave(int reps, const std::function<double()>& a, const std::function<double()>& b,
                       std::vector<double>* a_out, std::vector<double>* b_out) {
  for (int r = 0; r < reps; ++r) {
    a_out->push_back(a());
    b_out->push_back(b());
  }
}

class Bench {
 public:
  // decode_graphs: the model of every group but G (which loads both kinds).
  // precision: the number formats of the model the groups P1, P3, S, G and
  // A measure (Q and W load their own).
  Bench(const std::string& path, const std::string& device, txl::Kernels kernels, txl::DecodeGraphs decode_graphs,
        int threads, Sizes sizes, txl::WeightDtype dtype = txl::WeightDtype::kFloat32,
        txl::KvDtype kv_dtype = txl::KvDtype::kFloat32, bool sdpa_pass_attention = false);

  const txl::ModelConfig& config() const { return config_; }
  void Sync() const;
  static void Progress(const std::string& what) { std::cerr << "engine_bench: " << what << std::endl; }

  // ---- Timed engine steps (engine_bench_steps.cc).
  std::vector<int> RandomTokens(int64_t n, uint64_t seed) const;
  std::unique_ptr<SessionState> FullSession(int64_t mem_len, uint64_t seed, LanguageModel* lm = nullptr);
  double EngineSteps(const std::vector<SessionState*>& sessions, int n, LanguageModel* lm = nullptr);

  // What each session asks of a step (W rows): nothing (the layers alone),
  // its whole distribution, the model's nucleus and the host's top-p draw
  // from it, the model's argmax (greedy), the model's draw (temperature 1,
  // or 0.8 over the whole row), one target's log-prob (Score), the model's
  // list of 40 and the host's top-k draw from it, or the model's list of 5
  // (greedy with logprobs 5: the token and its alternatives), or the
  // model's constrained draw at temperature 1 (SamplingPlan::allowed) under
  // a constraint that allows 99% of the words (its first pick is nearly
  // always taken, as inside a JSON string), or 8 words (nearly always
  // refused and drawn again): of the shortlist (as JSON's punctuation is,
  // being frequent), or spread over the clusters.
  enum class Readout {
    kNone,
    kDistribution,
    kTopP,
    kArgmax,
    kDraw,
    kScore,
    kTopK,
    kTopN,
    kDrawTempered,
    kDrawAllowingMost,
    kDrawAllowingFew,
    kDrawAllowingFewSpread
  };
  static const char* ReadoutName(Readout r);
  int ZipfToken();
  double MeanEntropy(const std::vector<SessionState*>& sessions);
  double TimedSteps(const std::vector<SessionState*>& sessions, int n, LanguageModel* lm,
                    const std::function<void(size_t, StepInput&)>& fill, const std::function<void(StepOutput&)>& read);
  double ReadoutSteps(const std::vector<SessionState*>& sessions, int n, Readout readout, LanguageModel* lm = nullptr);
  double ScoreSteps(const std::vector<SessionState*>& sessions, int n, int64_t seg);
  std::unique_ptr<LanguageModel> Load(txl::WeightDtype dtype, txl::KvDtype kv) const;

  // ---- What a step is compared with (engine_bench_baselines.cc).
  double HiddenStateSteps(const std::vector<at::Tensor>& mems, int n);
  double RecomputeSteps(const at::Tensor& window_tokens, int n);
  double BandwidthPass(const at::Tensor& probe, int n);
  double SameSizeFloor(int64_t bytes);
  // Bytes one single-token step must read: every layer's weights, the output
  // layer, one embedding row, the session's keys/values, and the position
  // term's minimum (PositionTermBytes).
  int64_t FloorBytes(int64_t mem) const { return FloorBytesWithoutPositions(mem) + PositionTermBytes(mem + 1); }
  int64_t ReducedFloorBytes(int64_t mem, int64_t weight_bytes, int64_t kv_bytes) const;
  int64_t PositionTermBytes(int64_t window) const;
  int64_t FloorBytesWithoutPositions(int64_t mem) const;
  // Bytes of the relative-position key table the engine reads for a window.
  int64_t RelTableBytes(int64_t window) const { return config_.n_layer * window * config_.n_head * config_.d_head * 4; }

  // ---- The groups (engine_bench_groups.cc, engine_bench_vocab.cc, engine_bench_precision.cc).
  std::vector<Row> Run();
  void WRows(std::vector<Row>* rows);
  void QRows(std::vector<Row>* rows);
  static Row Ratio(std::string id, std::string measurement, std::string a_name, std::string b_name,
                   const std::vector<double>& a_sec, const std::vector<double>& b_sec, double target, bool speedup);
  static Row Throughput(std::string id, std::string measurement, const std::vector<double>& bf_sec,
                        const std::vector<double>& f32_sec, double tokens, double target);

  void set_quick(bool q) { quick_ = q; }
  void set_only(std::vector<std::string> only) { only_ = std::move(only); }
  bool Want(const std::string& group) const {
    return only_.empty() || std::find(only_.begin(), only_.end(), group) != only_.end();
  }
  double sink() const { return sink_; }

 private:
  // ---- Run's groups and their rows (engine_bench_groups.cc).
  // P5 then P3 on the same N full sessions.
  void SessionRows(std::vector<Row>* rows);
  std::vector<std::unique_ptr<SessionState>> NewSessions(int n);
  void FillByStepping(std::vector<std::unique_ptr<SessionState>>& sessions, int seed);
  Row MemoryRow(std::vector<std::unique_ptr<SessionState>>* sessions, std::vector<SessionState*>* all);
  Row BatchedDecodeRow(const std::vector<SessionState*>& all, const std::vector<SessionState*>& one);
  // P1 then P1f on one session.
  void OneSessionRows(std::vector<Row>* rows);
  Row HiddenStateRow(const std::vector<SessionState*>& one, const std::vector<at::Tensor>& mems);
  Row BandwidthFloorRow(const std::vector<SessionState*>& one);
  Row ScoreRow();  // S
  // G1 and G3: decode graphs against none; A1 and A3: the split decode
  // attention against tensor ops (engine_bench_graphs.cc).
  void GraphRows(std::vector<Row>* rows);
  void PairRows(const std::string& group, const std::string& what, const std::string& a_name, const std::string& b_name,
                std::unique_ptr<LanguageModel> with, std::unique_ptr<LanguageModel> without, std::vector<Row>* rows);
  std::unique_ptr<LanguageModel> LoadWith(txl::DecodeGraphs decode_graphs, bool split_decode_attention) const;
  Row RecomputeRow(int64_t w);  // P2, one window
  // ---- Group Q's parts after Q1 (engine_bench_precision.cc).
  Row PrefillRow(LanguageModel* f32, LanguageModel* bf);  // Q4
  std::vector<std::unique_ptr<SessionState>> FilledSessions(LanguageModel* lm);
  void ManySessionRows(LanguageModel* f32, LanguageModel* bf, const at::Tensor& probe, int64_t probe_bytes,
                       std::vector<Row>* rows);  // Q3, Q3f
  void ManySessionFloorRows(const std::vector<double>& mbf, const std::vector<double>& m32,
                            const std::vector<double>& mpass, int64_t probe_bytes, std::vector<Row>* rows);

  Sizes sizes_;
  std::string path_;
  std::string device_;
  txl::Kernels kernels_;
  txl::DecodeGraphs decode_graphs_;
  txl::WeightDtype dtype_;
  txl::KvDtype kv_dtype_;
  bool sdpa_pass_attention_;  // LanguageModelOptions::sdpa_pass_attention of those models
  bool cuda_;
  bool quick_ = false;
  std::vector<std::string> only_;
  std::unique_ptr<LanguageModel> lm_;
  txl::ModelConfig config_;
  txl::TxlWeights weights_;
  int64_t counter_ = 1;
  double sink_ = 0;
  std::mt19937_64 draw_rng_{7};
  std::vector<double> zipf_cdf_;
  std::shared_ptr<const txl::AllowedTokens> allowing_most_, allowing_few_, allowing_spread_;  // kDrawAllowing*
  txl::Sampler top_p_{TopSampling(0, 0.9f), 7};
  txl::Sampler top_k_{TopSampling(40, 0.0f), 7};
  static txl::SamplingConfig TopSampling(int top_k, float top_p) {
    txl::SamplingConfig c;
    c.temperature = 0.8f;
    c.top_k = top_k;
    c.top_p = top_p;
    c.seed = 7;
    return c;
  }
  double load_seconds_ = 0;
  int64_t rss_after_load_ = 0;
};

}  // namespace engine_bench

#endif  // TXL_BENCH_ENGINE_BENCH_H_
