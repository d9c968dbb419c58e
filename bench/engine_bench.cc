// engine_bench: the engine's incremental step against the ways the original
// code would serve the same prediction, measured in one run. Every figure is
// a ratio of two interleaved measurements (A B A B ...; each repetition times
// a batch of steps; the median over repetitions is reported); absolute times
// are printed for reference only.
//   engine_bench --shape base --threads 2 --reps 5 --json out.json
//   engine_bench --quick --shape small        (CI: checks that it works)
//
// P1   one session, one token per step, 800 positions of memory: engine step
//      vs (b) hidden-state memory (TrainingForward with mems, keys/values of
//      the whole memory projected again every step) + the output softmax.
// P1f  engine step vs the bandwidth floor: bytes that must be read per step
//      (weights touched by one token, the position term's minimum, the
//      session's K/V) / measured bandwidth.
// P2   engine step vs (a) recompute: the whole window through the model with
//      no memory, at attention windows 800 and 3800.
// P3   aggregate tokens/s, 32 sessions in one step vs 1 session.
// P5   resident bytes per session (RSS growth) vs memory_bytes() per session.
// S    scoring (teacher-forced segments, every position's target log-prob):
//      64-token segments with a window of 640, 32 sessions per step vs 1,
//      tokens/s: the setting of NVIDIA's published Transformer-XL figures
//      (tgt_len 64, mem_len 640, batch 1 and 32).
// Q    reduced precision (model/precision.h) against float32, interleaved:
//      Q1-bf16 / Q1-int8 one-session step (bf16 or int8 weights, bf16
//      memories) vs the float32 step; Q1f-* each vs its own bandwidth floor;
//      Q5-* vs the hidden-state baseline (the original code's speed);
//      Q3 32 sessions, aggregate tokens/s, bf16 vs float32 (Q3f-* each step
//      vs its bandwidth floor: Q3's ceiling); Q4 prefill of a
//      2048-token input, tokens/s, bf16 (AMX where the CPU has it) vs float32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/cuda.h>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "base/flags_help.h"
#include "model/net/checkpoint.h"
#include "model/net/language_model.h"
#include "model/tokenizer.h"
#include "model/net/txl_math.h"
#include "model/net/weights.h"
#include "nlohmann/json.hpp"
#include "server/sampling/sampler.h"
#include "train/training_forward.h"

#ifndef TXL_BUNDLED_MODEL
#define TXL_BUNDLED_MODEL ""
#endif

ABSL_FLAG(std::string, shape, "base",
          "base (random 12-layer d512 model), wt103 (random model of the WikiText-103 shape: 18 layers d1024, "
          "267,735-word adaptive softmax; about 1.1 GB) or small (the bundled model)");
ABSL_FLAG(std::string, model, "", "checkpoint for --shape small (default: the bundled model)");
ABSL_FLAG(double, head_scale, 20,
          "--shape wt103: the head projection's scale (1: raw random weights, flat distributions; "
          "20: about the peakedness of a trained model)");
ABSL_FLAG(int, threads, 2, "intra-op threads (model and bandwidth probe alike)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, kernels, "auto", "auto or generic (libtorch ops, the GPU's code, on a CPU too)");
ABSL_FLAG(int, reps, 5, "interleaved repetitions; medians are reported");
ABSL_FLAG(bool, quick, false, "tiny sizes and 2 repetitions: only checks that it works");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this file");
ABSL_FLAG(int, sessions, 32, "concurrent sessions for P3 and P5");
ABSL_FLAG(std::vector<std::string>, only, {}, "run only these groups (P1, P2, P3, S, Q, W)");

namespace {

using Clock = std::chrono::steady_clock;
using txl::LanguageModel;
using txl::SessionState;
using txl::StepInput;
using txl::StepOutput;

[[noreturn]] void Fail(const std::string& what) {
  std::cerr << "engine_bench: " << what << "\n";
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Fail(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Resident bytes, after the allocator returns its free pages: what is live
// (sessions, model, and the pages their fragmentation pins), not what earlier
// steps' freed scratch left mapped (which made P5 vary 0.7-1.1 between runs).
int64_t RssBytes() {
  malloc_trim(0);
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown";
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
void Interleave(int reps, const std::function<double()>& a, const std::function<double()>& b,
                std::vector<double>* a_out, std::vector<double>* b_out) {
  for (int r = 0; r < reps; ++r) {
    a_out->push_back(a());
    b_out->push_back(b());
  }
}

class Bench {
 public:
  Bench(const std::string& path, const std::string& device, txl::Kernels kernels, int threads, Sizes sizes)
      : sizes_(std::move(sizes)), path_(path), device_(device), kernels_(kernels), cuda_(device != "cpu") {
    txl::LanguageModelOptions o;
    o.path = path;
    o.device = device;
    o.kernels = kernels;
    o.threads = threads;
    const auto start = Clock::now();
    lm_ = Must(LanguageModel::Create(o), "loading " + path);
    load_seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
    rss_after_load_ = RssBytes();
    txl::Checkpoint ckpt = Must(txl::LoadCheckpoint(path), "loading " + path);
    config_ = ckpt.config;
    weights_ = ckpt.weights->To(at::Device(device));
  }

  const txl::ModelConfig& config() const { return config_; }

  void Sync() const {
    if (cuda_) torch::cuda::synchronize();
  }

  std::vector<int> RandomTokens(int64_t n, uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> d(0, static_cast<int>(config_.n_token) - 1);
    std::vector<int> t(n);
    for (int& x : t) x = d(rng);
    return t;
  }

  std::unique_ptr<SessionState> FullSession(int64_t mem_len, uint64_t seed, LanguageModel* lm = nullptr) {
    if (lm == nullptr) lm = lm_.get();
    auto s = Must(lm->NewSession(mem_len), "new session");
    std::vector<StepInput> in(1);
    in[0].session = s.get();
    in[0].tokens = RandomTokens(mem_len - 1, seed);
    Must(lm->Step(absl::MakeSpan(in)), "filling a session");
    if (s->memory_tokens() != mem_len - 1) Fail("a filled session does not hold a full window");
    return s;
  }

  // Seconds per step over `n` single-token steps of all `sessions` at once,
  // each asking for its next-token distribution.
  double EngineSteps(const std::vector<SessionState*>& sessions, int n, LanguageModel* lm = nullptr) {
    return ReadoutSteps(sessions, n, Readout::kDistribution, lm);
  }

  // What each session asks of a step (W rows): nothing (the layers alone),
  // its whole distribution, the model's nucleus and the host's top-p draw
  // from it, the model's argmax (greedy), the model's draw (temperature 1,
  // or 0.8 over the whole row), one target's log-prob (Score), the model's
  // list of 40 and the host's top-k draw from it, or the model's list of 5
  // (greedy with logprobs 5: the token and its alternatives).
  enum class Readout { kNone, kDistribution, kTopP, kArgmax, kDraw, kScore, kTopK, kTopN, kDrawTempered };
  static const char* ReadoutName(Readout r) {
    switch (r) {
      case Readout::kNone: return "layers only";
      case Readout::kDistribution: return "whole distribution";
      case Readout::kTopP: return "top-p 0.9 at temperature 0.8 (the model's nucleus list + the host's cut and draw)";
      case Readout::kDrawTempered: return "temperature 0.8 (the model's draw over the whole row)";
      case Readout::kArgmax: return "greedy (model argmax)";
      case Readout::kDraw: return "temperature 1 (model draw)";
      case Readout::kScore: return "Score (one target's log-prob, Zipf-ranked targets)";
      case Readout::kTopK: return "top-k 40 at temperature 0.8 (the model's list + the host's draw)";
      case Readout::kTopN: return "greedy with 5 alternatives (the model's list of 5)";
    }
    return "";
  }

  // A target as text has them: ids ranked by frequency (as word-level
  // vocabularies are), drawn with probability 1 / (rank + 1). With
  // WT103's cutoffs, 80% fall in the 20,000-word shortlist.
  int ZipfToken() {
    if (zipf_cdf_.empty()) {
      double acc = 0;
      for (int64_t k = 0; k < config_.n_token; ++k) zipf_cdf_.push_back(acc += 1.0 / (k + 1));
    }
    const double u = std::uniform_real_distribution<double>(0.0, zipf_cdf_.back())(draw_rng_);
    const size_t k = std::upper_bound(zipf_cdf_.begin(), zipf_cdf_.end(), u) - zipf_cdf_.begin();
    return static_cast<int>(std::min<size_t>(k, zipf_cdf_.size() - 1));
  }

  // Mean entropy (nats) of the sessions' next-token distributions.
  double MeanEntropy(const std::vector<SessionState*>& sessions) {
    std::vector<StepInput> in(sessions.size());
    for (size_t s = 0; s < sessions.size(); ++s) {
      in[s].session = sessions[s];
      in[s].tokens = {static_cast<int>((counter_++ * 7919) % config_.n_token)};
      in[s].want_last_distribution = true;
    }
    double total = 0;
    for (const StepOutput& o : Must(lm_->Step(absl::MakeSpan(in)), "engine step")) {
      for (float lp : o.last_distribution) total -= std::exp(lp) * lp;
    }
    return total / sessions.size();
  }

  // Seconds per step over `n` steps of all `sessions` at once: fill(s, in)
  // sets session s's input beyond its session, read(out) consumes each output.
  double TimedSteps(const std::vector<SessionState*>& sessions, int n, LanguageModel* lm,
                    const std::function<void(size_t, StepInput&)>& fill, const std::function<void(StepOutput&)>& read) {
    std::vector<StepInput> in(sessions.size());
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      for (size_t s = 0; s < sessions.size(); ++s) {
        in[s] = StepInput();
        in[s].session = sessions[s];
        fill(s, in[s]);
      }
      for (StepOutput& o : Must(lm->Step(absl::MakeSpan(in)), "engine step")) read(o);
    }
    return std::chrono::duration<double>(Clock::now() - start).count() / n;
  }

  double ReadoutSteps(const std::vector<SessionState*>& sessions, int n, Readout readout, LanguageModel* lm = nullptr) {
    auto fill = [&](size_t, StepInput& x) {
      x.tokens = {static_cast<int>((counter_++ * 7919) % config_.n_token)};
      switch (readout) {
        case Readout::kNone: break;
        case Readout::kDistribution: x.want_last_distribution = true; break;
        case Readout::kTopP:
          x.nucleus_p = 0.9f;
          x.nucleus_temperature = 0.8f;
          break;
        case Readout::kDrawTempered:
          x.pick = StepInput::Pick::kDraw;
          x.draw_temperature = 0.8f;
          x.draw_uniform = std::uniform_real_distribution<double>(0.0, 1.0)(draw_rng_);
          break;
        case Readout::kArgmax: x.pick = StepInput::Pick::kArgmax; break;
        case Readout::kDraw:
          x.pick = StepInput::Pick::kDraw;
          x.draw_uniform = std::uniform_real_distribution<double>(0.0, 1.0)(draw_rng_);
          break;
        case Readout::kScore: x.targets = {ZipfToken()}; break;
        case Readout::kTopK: x.top_n = top_k_.TopCandidates(); break;
        case Readout::kTopN: x.top_n = 5; break;
      }
    };
    auto read = [&](StepOutput& o) {
      if (readout == Readout::kTopP) sink_ += top_p_.SampleFromNucleus(o.nucleus, o.nucleus_total);
      if (readout == Readout::kTopK) sink_ += top_k_.SampleFromTop(o.top);
      if (readout == Readout::kTopN) sink_ += o.top[4].first;
      if (readout == Readout::kDistribution) sink_ += o.last_distribution[0];
      sink_ += o.picked + (o.target_logprobs.empty() ? 0 : o.target_logprobs[0]);
    };
    return TimedSteps(sessions, n, lm == nullptr ? lm_.get() : lm, fill, read);
  }

  // Seconds per step over `n` steps that each feed every session a segment of
  // `seg` tokens and score each position's next token (as Score does).
  double ScoreSteps(const std::vector<SessionState*>& sessions, int n, int64_t seg) {
    std::vector<std::vector<int>> tokens, targets;
    for (size_t s = 0; s < sessions.size(); ++s) {
      tokens.push_back(RandomTokens(seg, 100 + s));
      targets.push_back(RandomTokens(seg, 200 + s));
    }
    return TimedSteps(
        sessions, n, lm_.get(),
        [&](size_t s, StepInput& x) {
          x.tokens = tokens[s];
          x.targets = targets[s];
        },
        [&](StepOutput& o) { sink_ += o.target_logprobs.back(); });
  }

  // The original code's step: hidden-state mems of every layer, the new
  // token's segment forward (keys/values of the whole memory projected
  // again, mems updated), then the output softmax for that token.
  double HiddenStateSteps(const std::vector<at::Tensor>& mems, int n) {
    txl::ModelConfig c = config_;
    c.mem_len = mems[0].size(0) + 1;  // every memory position is attended, as in the engine
    c.same_length = true;
    const auto lopt = at::TensorOptions().dtype(at::kLong).device(device_);
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      c10::InferenceMode guard;
      at::Tensor tok = at::full({1, 1}, (counter_++ * 7919) % config_.n_token, lopt);
      txl::SegmentOutput seg = txl::TrainingForward(c, weights_, tok, mems, /*train=*/false);
      at::Tensor lp = txl::LogProbs(c, weights_, seg.hidden.view({1, c.d_model})).to(at::kCPU).contiguous();
      std::vector<float> dist(lp.data_ptr<float>(), lp.data_ptr<float>() + c.n_token);
      sink_ += dist[0] + seg.mems[0].size(0);
    }
    return std::chrono::duration<double>(Clock::now() - start).count() / n;
  }

  // Vanilla: the whole window through the model, no memory; the last
  // position's distribution.
  double RecomputeSteps(const at::Tensor& window_tokens, int n) {
    txl::ModelConfig c = config_;
    c.mem_len = window_tokens.size(0);
    c.same_length = true;
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      c10::InferenceMode guard;
      txl::SegmentOutput seg = txl::TrainingForward(c, weights_, window_tokens, {}, /*train=*/false);
      at::Tensor last = seg.hidden.select(0, seg.hidden.size(0) - 1);  // [1, d]
      at::Tensor lp = txl::LogProbs(c, weights_, last).to(at::kCPU).contiguous();
      std::vector<float> dist(lp.data_ptr<float>(), lp.data_ptr<float>() + c.n_token);
      sink_ += dist[0];
    }
    return std::chrono::duration<double>(Clock::now() - start).count() / n;
  }

  // Seconds per byte-read pass of `probe` (a timed reduction).
  double BandwidthPass(const at::Tensor& probe, int n) {
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      c10::InferenceMode guard;
      sink_ += probe.sum().item<float>();
    }
    return std::chrono::duration<double>(Clock::now() - start).count() / n;
  }

  // Seconds to read `bytes` from a buffer of that size, again and again: the
  // floor when a step's working set stays (partly) in a large last-level
  // cache, which the 512 MB probe's DRAM figure does not see.
  double SameSizeFloor(int64_t bytes) {
    at::Tensor probe = at::ones({bytes / 4});
    BandwidthPass(probe, 2);
    std::vector<double> passes;
    for (int r = 0; r < 5; ++r) passes.push_back(BandwidthPass(probe, 3));
    return Median(passes);
  }

  // Bytes one single-token step must read: every layer's weights, the output
  // layer, one embedding row, the session's keys/values, and the position
  // term's minimum (PositionTermBytes).
  int64_t FloorBytes(int64_t mem) const { return FloorBytesWithoutPositions(mem) + PositionTermBytes(mem + 1); }

  // The same floor for reduced precision: the layers' product matrices at
  // `weight_bytes` per element (int8: plus a float scale per row), keys and
  // values at `kv_bytes`, the position term at 2 bytes (the engine's table
  // is bfloat16 then; r_net at the weights' width). Everything else float32.
  int64_t ReducedFloorBytes(int64_t mem, int64_t weight_bytes, int64_t kv_bytes) const {
    int64_t total = FloorBytes(mem);
    int64_t r_net = 0;
    for (const txl::LayerWeights& L : weights_.layers) {
      for (const at::Tensor* t : {&L.qkv_w, &L.o_w, &L.ff1_w, &L.ff2_w}) {
        total -= t->numel() * (4 - weight_bytes);
        if (weight_bytes == 1) total += t->size(0) * 4;
      }
      r_net += L.r_w.numel() * weight_bytes;
    }
    total -= config_.n_layer * 2 * mem * config_.n_head * config_.d_head * (4 - kv_bytes);
    total -= PositionTermBytes(mem + 1);
    return total + std::min(r_net, RelTableBytes(mem + 1) / 2);
  }

  // The position scores (q + v) . W_r R(d) need, for every layer, either
  // r_net's weights W_r (the product formed per step) or a table of W_r R(d)
  // over the window (the engine's choice: less compute); no exact step reads
  // neither, so the floor counts the smaller.
  int64_t PositionTermBytes(int64_t window) const {
    int64_t r_net = 0;
    for (const txl::LayerWeights& L : weights_.layers) r_net += L.r_w.numel() * L.r_w.element_size();
    return std::min(r_net, RelTableBytes(window));
  }

  int64_t FloorBytesWithoutPositions(int64_t mem) const {
    auto bytes = [](const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; };
    int64_t total = 0;
    for (const txl::LayerWeights& L : weights_.layers) {
      for (const at::Tensor* t : {&L.qkv_w, &L.o_w, &L.attn_ln_w, &L.attn_ln_b, &L.ff1_w, &L.ff1_b, &L.ff2_w, &L.ff2_b,
                                  &L.ff_ln_w, &L.ff_ln_b})
        total += bytes(*t);
    }
    for (const auto& t : weights_.out_w) total += bytes(t);
    for (const auto& t : weights_.out_b) total += bytes(t);
    for (const auto& t : weights_.out_projs) total += bytes(t);
    total += bytes(weights_.cluster_w) + bytes(weights_.cluster_b);
    total += 2 * config_.n_head * config_.d_head * 4 * config_.n_layer;        // u, v biases (upper bound)
    total += config_.embed_dim() * 4;                                          // one embedding row
    total += config_.n_layer * 2 * mem * config_.n_head * config_.d_head * 4;  // K/V
    return total;
  }

  // Bytes of the relative-position key table the engine reads for a window.
  int64_t RelTableBytes(int64_t window) const { return config_.n_layer * window * config_.n_head * config_.d_head * 4; }

  static void Progress(const std::string& what) { std::cerr << "engine_bench: " << what << std::endl; }

  std::vector<Row> Run() {
    std::vector<Row> rows;
    const Sizes& z = sizes_;
    const int64_t mem = z.mem;
    const int64_t d = config_.d_model;

    // ---- P5 then P3: N sessions with full windows. First, while the heap
    // holds nothing freed by the other measurements.
    if (Want("P3")) {
      const int N = z.sessions;
      Progress(absl::StrFormat("P5: %d sessions", N));
      auto single = FullSession(mem + 1, 9);
      std::vector<SessionState*> one = {single.get()};
      EngineSteps(one, 2);
      // Fill by stepping, a few sessions per step (as a server's prefill would).
      constexpr int kFillGroup = 4;
      auto fill = [&](std::vector<std::unique_ptr<SessionState>>& sessions, int seed) {
        for (size_t g = 0; g < sessions.size(); g += kFillGroup) {
          std::vector<StepInput> in;
          for (size_t i = g; i < std::min(sessions.size(), g + kFillGroup); ++i) {
            StepInput x;
            x.session = sessions[i].get();
            x.tokens = RandomTokens(mem, seed + i);
            in.push_back(std::move(x));
          }
          Must(lm_->Step(absl::MakeSpan(in)), "filling sessions");
        }
      };
      auto make = [&](int n) {
        std::vector<std::unique_ptr<SessionState>> out;
        for (int i = 0; i < n; ++i) out.push_back(Must(lm_->NewSession(mem + 1), "new session"));
        return out;
      };
      // The heap first serves one fill step and then frees it, as a running
      // server's has: the per-step working set (scores, padded batches) is
      // then already resident, and RSS growth measures what the sessions
      // themselves keep (including any heap holes they cause).
      {
        auto warm = make(kFillGroup);
        fill(warm, 50);
      }
      // Freed blocks can still be reused by the first sessions (which would
      // flatter them), so the figure is the growth over the second half of
      // the sessions; the growth over all of them is reported too.
      const int64_t rss_before = RssBytes();
      std::vector<std::unique_ptr<SessionState>> sessions = make(N / 2);
      fill(sessions, 100);
      const int64_t rss_mid = RssBytes();
      {
        auto more = make(N - N / 2);
        fill(more, 100 + N);
        for (auto& s : more) sessions.push_back(std::move(s));
      }
      std::vector<SessionState*> all;
      for (auto& s : sessions) all.push_back(s.get());
      EngineSteps(all, 1);  // every window full and one decode step taken
      const int64_t rss_after = RssBytes();
      int64_t mem_bytes = 0;
      for (auto& s : sessions) {
        if (s->memory_tokens() != mem) Fail("a session's window is not full");
        mem_bytes += s->memory_bytes();
      }
      Row p5;
      p5.id = "P5";
      p5.measurement = absl::StrFormat(
          "%d sessions, window full (%d positions): RSS growth over the last %d vs memory_bytes()", N, mem, N - N / 2);
      p5.a_name = "RSS growth per session";
      p5.b_name = "memory_bytes() per session";
      p5.unit = "MB/session";
      const int second_half = N - N / 2;
      p5.a = static_cast<double>(rss_after - rss_mid) / second_half / 1e6;
      p5.b = static_cast<double>(mem_bytes) / N / 1e6;
      p5.a_reps = {p5.a};
      p5.b_reps = {p5.b};
      p5.ratio = p5.a / p5.b;
      p5.target = 1.05;
      p5.at_least = false;
      p5.extra = {{"rss_before_bytes", rss_before},
                  {"rss_before_note", "after one warm-up fill step of throwaway sessions, freed; no malloc_trim"},
                  {"rss_mid_bytes", rss_mid},
                  {"rss_after_bytes", rss_after},
                  {"rss_growth_per_session_all", static_cast<double>(rss_after - rss_before) / N},
                  {"memory_bytes_total", mem_bytes},
                  {"raw_kv_bytes_per_session", config_.n_layer * 2 * mem * config_.n_head * config_.d_head * 4}};
      if (cuda_) p5.extra["note"] = "device memory is not in the RSS: not meaningful on cuda";
      rows.push_back(p5);

      EngineSteps(all, 1);
      Progress("P3: batched decode");
      Row p3;
      p3.id = "P3";
      p3.measurement = absl::StrFormat("aggregate tokens/s: %d sessions per step vs 1 session (memory %d)", N, mem);
      p3.a_name = absl::StrFormat("%d sessions", N);
      p3.b_name = "1 session";
      p3.unit = "tokens/s";
      std::vector<double> a_sec, b_sec;
      Interleave(
          z.reps, [&] { return EngineSteps(all, z.multi_batch); }, [&] { return EngineSteps(one, z.engine_batch); },
          &a_sec, &b_sec);
      for (double t : a_sec) p3.a_reps.push_back(N / t);
      for (double t : b_sec) p3.b_reps.push_back(1 / t);
      p3.a = Median(p3.a_reps);
      p3.b = Median(p3.b_reps);
      p3.ratio = p3.a / p3.b;
      p3.target = 4;
      p3.extra = {{"step_seconds_32", a_sec}, {"step_seconds_1", b_sec}};
      rows.push_back(p3);
    }
    // ---- P1 and the bandwidth floor: one session, `mem` positions of memory.
    if (Want("P1")) {
      Progress("P1: hidden-state memory baseline");
      auto s = FullSession(mem + 1, 1);
      std::vector<SessionState*> one = {s.get()};
      std::vector<at::Tensor> mems;
      at::manual_seed(3);
      for (int64_t l = 0; l < config_.n_layer; ++l)
        mems.push_back(at::randn({mem, 1, d}, at::TensorOptions().device(device_)));
      EngineSteps(one, 2);  // warm-up (rel table, allocator)
      HiddenStateSteps(mems, 1);

      Row r;
      r.id = "P1";
      r.measurement =
          absl::StrFormat("1 session, 1 token/step, memory %d: engine step vs hidden-state memory (b)", mem);
      r.a_name = "engine step";
      r.b_name = "hidden-state mems step";
      r.unit = "ms/step";
      Interleave(
          z.reps, [&] { return EngineSteps(one, z.engine_batch); },
          [&] { return HiddenStateSteps(mems, z.baseline_batch); }, &r.a_reps, &r.b_reps);
      r.a = Median(r.a_reps);
      r.b = Median(r.b_reps);
      r.ratio = r.b / r.a;
      r.target = 15;
      rows.push_back(r);

      // Bandwidth: a reduction over a 512 MB float tensor (64 MB in quick mode),
      // with the model's thread count, interleaved with the engine step.
      const int64_t probe_bytes = quick_ ? (64ll << 20) : (512ll << 20);
      at::Tensor probe = at::ones({probe_bytes / 4}, at::TensorOptions().device(device_));
      BandwidthPass(probe, 1);
      Progress("P1f: bandwidth floor");
      Row f;
      f.id = "P1f";
      const int64_t floor_bytes = FloorBytes(mem);
      f.measurement = absl::StrFormat("engine step vs bandwidth floor (%.1f MB read per step / measured bandwidth)",
                                      floor_bytes / 1e6);
      f.a_name = "engine step";
      f.b_name = "floor";
      f.unit = "ms/step";
      std::vector<double> pass;
      Interleave(
          z.reps, [&] { return EngineSteps(one, z.engine_batch); }, [&] { return BandwidthPass(probe, 3); }, &f.a_reps,
          &pass);
      for (double p : pass) f.b_reps.push_back(floor_bytes * p / probe_bytes);
      f.a = Median(f.a_reps);
      f.b = Median(f.b_reps);
      f.ratio = f.a / f.b;
      f.target = 1.25;
      f.at_least = false;
      const double bw = probe_bytes / Median(pass);
      const int64_t engine_bytes = FloorBytesWithoutPositions(mem) + RelTableBytes(mem + 1);
      f.extra = {{"floor_bytes", floor_bytes},
                 {"position_term_bytes", PositionTermBytes(mem + 1)},
                 {"bandwidth_bytes_per_s", bw},
                 {"bandwidth_probe_bytes", probe_bytes},
                 {"rel_table_bytes_read", RelTableBytes(mem + 1)},
                 {"engine_bytes_read", engine_bytes},
                 {"step_over_engine_bytes", f.a / (engine_bytes / bw)},
                 {"step_over_floor_without_positions", f.a / (FloorBytesWithoutPositions(mem) / bw)}};
      const double same = SameSizeFloor(floor_bytes);
      f.extra["same_size_floor_s"] = same;
      f.extra["step_over_same_size_floor"] = f.a / same;
      rows.push_back(f);
    }

    if (Want("W")) WRows(&rows);

    // ---- S: scoring segments, NVIDIA's published setting (64 tokens, window 640).
    if (Want("S")) {
      const int64_t seg = quick_ ? 16 : 64, window = quick_ ? 64 : 640;
      const int N = z.sessions;
      Progress(absl::StrFormat("S: scoring %d-token segments, %d sessions", seg, N));
      std::vector<std::unique_ptr<SessionState>> sessions;
      std::vector<SessionState*> all;
      for (int i = 0; i < N; ++i) {
        sessions.push_back(FullSession(window, 300 + i));
        all.push_back(sessions.back().get());
      }
      std::vector<SessionState*> one = {all[0]};
      ScoreSteps(all, 1, seg);  // warm-up
      Row r;
      r.id = "S";
      r.measurement = absl::StrFormat(
          "scoring %d-token segments, window %d: aggregate tokens/s, %d sessions per step vs 1", seg, window, N);
      r.a_name = absl::StrFormat("%d sessions", N);
      r.b_name = "1 session";
      r.unit = "tokens/s";
      std::vector<double> a_sec, b_sec;
      Interleave(
          z.reps, [&] { return ScoreSteps(all, z.multi_batch, seg); },
          [&] { return ScoreSteps(one, z.engine_batch, seg); }, &a_sec, &b_sec);
      for (double t : a_sec) r.a_reps.push_back(N * seg / t);
      for (double t : b_sec) r.b_reps.push_back(seg / t);
      r.a = Median(r.a_reps);
      r.b = Median(r.b_reps);
      r.ratio = r.a / r.b;
      r.target = 1;
      r.extra = {{"step_seconds_batch", a_sec},
                 {"step_seconds_1", b_sec},
                 {"published",
                  "NVIDIA DeepLearningExamples Transformer-XL base, 1x A100 40GB, tgt_len 64, "
                  "mem_len 640: TorchScript FP16 6,936 tokens/s at batch 1 and 107,082 at batch 32; "
                  "TF32 6,085 and 71,124"}};
      rows.push_back(r);
    }

    // ---- Q: reduced precision against float32 (this model, lm_), on the
    // same weights and threads, every measurement interleaved in one loop.
    // The CPU kernels' rows: not on a GPU, nor on the generic path (no int8).
    if (Want("Q") && !cuda_ && kernels_ != txl::Kernels::kGeneric) QRows(&rows);

    // ---- P2: recompute the whole window vs the engine step, per window.
    for (int64_t w : Want("P2") ? z.windows : std::vector<int64_t>{}) {
      Progress(absl::StrFormat("P2: recompute, window %d", w));
      auto s = FullSession(w, 2);
      std::vector<SessionState*> one = {s.get()};
      const std::vector<int> toks = RandomTokens(w, 5);
      at::Tensor window =
          at::tensor(std::vector<int64_t>(toks.begin(), toks.end()), at::kLong).view({w, 1}).to(at::Device(device_));
      EngineSteps(one, 2);
      const int reps = w > 2000 ? std::max(2, std::min(z.reps, 3)) : z.reps;
      Row r;
      r.id = absl::StrFormat("P2-%d", w);
      r.measurement = absl::StrFormat("1 session, window %d: engine step vs recompute the window (a)", w);
      r.a_name = "engine step";
      r.b_name = "recompute";
      r.unit = "ms/step";
      Interleave(
          reps, [&] { return EngineSteps(one, z.engine_batch); }, [&] { return RecomputeSteps(window, 1); }, &r.a_reps,
          &r.b_reps);
      r.a = Median(r.a_reps);
      r.b = Median(r.b_reps);
      r.ratio = r.b / r.a;
      r.target = w > 2000 ? 250 : 100;
      rows.push_back(r);
    }

    return rows;
  }

  // ---- W: the output side of a large vocabulary (--shape wt103; any shape
  // runs it). W1-<mem>: one session's greedy step vs its bandwidth floor.
  // W3-*: N sessions at the first memory, each readout's step vs the layers
  // alone: the share of the step after the last layer's hidden states. W5:
  // start-up (load time, RSS).
  void WRows(std::vector<Row>* rows) {
    const Sizes& z = sizes_;
    Row up;
    up.id = "W5";
    up.measurement = "start-up: LanguageModel::Create (read, convert, pack) and the RSS after it";
    up.a_name = "load";
    up.b_name = "RSS after load";
    up.unit = "s";
    up.b_unit = "MB";
    up.a = load_seconds_;
    up.b = rss_after_load_ / 1e6;
    up.a_reps = {up.a};
    up.b_reps = {up.b};
    int64_t weight_bytes = 0;
    for (const at::Tensor& t : weights_.Parameters(config_)) weight_bytes += t.numel() * t.element_size();
    up.ratio = rss_after_load_ / static_cast<double>(weight_bytes);
    up.target = 2.5;
    up.at_least = false;
    up.measurement += absl::StrFormat(" (ratio: RSS / %.1f MB of float32 weights)", weight_bytes / 1e6);
    up.extra = {{"weight_bytes", weight_bytes}};
    rows->push_back(up);

    const int64_t probe_bytes = quick_ ? (64ll << 20) : (512ll << 20);
    at::Tensor probe = at::ones({probe_bytes / 4}, at::TensorOptions().device(device_));
    BandwidthPass(probe, 1);
    for (int64_t mem : z.w_mems) {
      Progress(absl::StrFormat("W1: one session, memory %d", mem));
      auto s = FullSession(mem + 1, 21);
      std::vector<SessionState*> one = {s.get()};
      ReadoutSteps(one, 2, Readout::kArgmax);
      const int64_t floor_bytes = FloorBytes(mem);
      std::vector<double> step, pass, floor;
      Interleave(
          z.reps, [&] { return ReadoutSteps(one, z.engine_batch, Readout::kArgmax); },
          [&] { return BandwidthPass(probe, 3); }, &step, &pass);
      for (double p : pass) floor.push_back(floor_bytes * p / probe_bytes);
      Row f = Ratio(absl::StrFormat("W1-%d", mem),
                    absl::StrFormat("1 session, memory %d, greedy: engine step vs bandwidth floor (%.1f MB read per "
                                    "step / measured bandwidth)",
                                    mem, floor_bytes / 1e6),
                    "engine step", "floor", step, floor, 1.3, false);
      f.extra = {{"floor_bytes", floor_bytes},
                 {"bandwidth_bytes_per_s", probe_bytes / Median(pass)},
                 {"memory_bytes_per_session", s->memory_bytes()}};
      rows->push_back(f);
    }

    const int64_t mem = z.w_mems.front();
    const int N = z.sessions;
    Progress(absl::StrFormat("W3: %d sessions, memory %d", N, mem));
    // One filled session and copies of it: the same attention work as N
    // different histories, without N prefills.
    std::vector<std::unique_ptr<SessionState>> sessions;
    sessions.push_back(FullSession(mem + 1, 31));
    for (int i = 1; i < N; ++i) sessions.push_back(Must(sessions[0]->Clone(), "copying a session"));
    std::vector<SessionState*> all;
    for (auto& x : sessions) all.push_back(x.get());
    ReadoutSteps(all, 1, Readout::kNone);
    const double entropy = MeanEntropy(all);
    const std::pair<Readout, const char*> kinds[] = {{Readout::kArgmax, "greedy"},
                                                     {Readout::kDraw, "draw"},
                                                     {Readout::kScore, "score"},
                                                     {Readout::kTopN, "top-5"},
                                                     {Readout::kTopK, "top-k"},
                                                     {Readout::kTopP, "top-p"},
                                                     {Readout::kDrawTempered, "draw-0.8"},
                                                     {Readout::kDistribution, "rows"}};
    for (const auto& kind : kinds) {
      const Readout readout = kind.first;  // a variable, not a binding: lambdas capture it below
      const char* name = kind.second;
      std::vector<double> with, without;
      Interleave(
          z.reps, [&] { return ReadoutSteps(all, z.multi_batch, readout); },
          [&] { return ReadoutSteps(all, z.multi_batch, Readout::kNone); }, &with, &without);
      Row w = Ratio(absl::StrFormat("W3-%s", name),
                    absl::StrFormat("%d sessions, memory %d, next-token entropy %.1f nats, %s: the step's share "
                                    "after the last layer",
                                    N, mem, entropy, ReadoutName(readout)),
                    "step", "layers only", with, without, 0.10, false);
      w.ratio = (w.a - w.b) / w.a;  // the share, not a/b
      w.extra = {{"memory_bytes_per_session", sessions[0]->memory_bytes()},
                 {"tokens_per_s", N / w.a},
                 {"sessions", N},
                 {"memory_positions", mem},
                 {"next_token_entropy_nats", entropy}};
      rows->push_back(w);
    }
  }

  std::unique_ptr<LanguageModel> Load(txl::WeightDtype dtype, txl::KvDtype kv) const {
    txl::LanguageModelOptions o;
    o.path = path_;
    o.device = device_;
    o.kernels = kernels_;
    o.dtype = dtype;
    o.kv_dtype = kv;
    return Must(LanguageModel::Create(o), "loading " + path_ + " as " + txl::DtypeName(dtype));
  }

  // A row from per-repetition seconds: ratio a/b (or b/a for at_least rows
  // measured in seconds, i.e. speed-ups).
  static Row Ratio(std::string id, std::string measurement, std::string a_name, std::string b_name,
                   const std::vector<double>& a_sec, const std::vector<double>& b_sec, double target, bool speedup) {
    Row r;
    r.id = std::move(id);
    r.measurement = std::move(measurement);
    r.a_name = std::move(a_name);
    r.b_name = std::move(b_name);
    r.unit = "ms/step";
    r.a_reps = a_sec;
    r.b_reps = b_sec;
    r.a = Median(a_sec);
    r.b = Median(b_sec);
    r.ratio = speedup ? r.b / r.a : r.a / r.b;
    r.target = target;
    r.at_least = speedup;
    return r;
  }

  // A bf16-vs-float32 tokens/s row from per-repetition seconds per step
  // (or per token) of `tokens` tokens.
  static Row Throughput(std::string id, std::string measurement, const std::vector<double>& bf_sec,
                        const std::vector<double>& f32_sec, double tokens, double target) {
    Row r;
    r.id = std::move(id);
    r.measurement = std::move(measurement);
    r.a_name = "bf16";
    r.b_name = "float32";
    r.unit = "tokens/s";
    for (double t : bf_sec) r.a_reps.push_back(tokens / t);
    for (double t : f32_sec) r.b_reps.push_back(tokens / t);
    r.a = Median(r.a_reps);
    r.b = Median(r.b_reps);
    r.ratio = r.a / r.b;
    r.target = target;
    return r;
  }

  void QRows(std::vector<Row>* rows) {
    const Sizes& z = sizes_;
    const int64_t mem = z.mem;
    using txl::KvDtype;
    using txl::WeightDtype;
    Progress("Q: loading bfloat16 and int8 models");
    auto bf = Load(WeightDtype::kBfloat16, KvDtype::kBfloat16);
    auto i8 = Load(WeightDtype::kInt8, KvDtype::kBfloat16);
    Progress("Q: kernels " + bf->KernelPath());
    Progress("Q: kernels " + i8->KernelPath());
    LanguageModel* f32 = lm_.get();

    // One session each, full window; the hidden-state baseline; bandwidth.
    auto s32 = FullSession(mem + 1, 31, f32), sbf = FullSession(mem + 1, 31, bf.get()),
         si8 = FullSession(mem + 1, 31, i8.get());
    std::vector<SessionState*> o32 = {s32.get()}, obf = {sbf.get()}, oi8 = {si8.get()};
    std::vector<at::Tensor> mems;
    at::manual_seed(3);
    for (int64_t l = 0; l < config_.n_layer; ++l)
      mems.push_back(at::randn({mem, 1, config_.d_model}, at::TensorOptions().device(device_)));
    const int64_t probe_bytes = quick_ ? (64ll << 20) : (512ll << 20);
    at::Tensor probe = at::ones({probe_bytes / 4});
    for (auto* one : {&o32, &obf, &oi8}) EngineSteps(*one, 2, one == &o32 ? f32 : one == &obf ? bf.get() : i8.get());
    HiddenStateSteps(mems, 1);
    BandwidthPass(probe, 1);
    Progress("Q1: one session per precision, interleaved");
    std::vector<double> t32, tbf, ti8, base, pass;
    for (int r = 0; r < z.reps; ++r) {
      t32.push_back(EngineSteps(o32, z.engine_batch, f32));
      tbf.push_back(EngineSteps(obf, z.engine_batch, bf.get()));
      ti8.push_back(EngineSteps(oi8, z.engine_batch, i8.get()));
      base.push_back(HiddenStateSteps(mems, z.baseline_batch));
      pass.push_back(BandwidthPass(probe, 3));
    }
    const std::string m = absl::StrFormat("1 session, memory %d", mem);
    rows->push_back(Ratio("Q1-bf16", m + ": bf16 weights + bf16 memories step vs float32 step", "bf16 step",
                          "float32 step", tbf, t32, 0.55, false));
    rows->push_back(Ratio("Q1-int8", m + ": int8 weights + bf16 memories step vs float32 step", "int8 step",
                          "float32 step", ti8, t32, 0.40, false));
    const double bw = probe_bytes / Median(pass);
    for (auto [id, t, wb] : {std::tuple{"Q1f-bf16", &tbf, int64_t{2}}, std::tuple{"Q1f-int8", &ti8, int64_t{1}}}) {
      const int64_t bytes = ReducedFloorBytes(mem, wb, 2);
      std::vector<double> floor;
      for (double p : pass) floor.push_back(bytes * p / probe_bytes);
      Row f = Ratio(
          id, absl::StrFormat("%s step vs its bandwidth floor (%.1f MB / measured bandwidth)", id + 4, bytes / 1e6),
          "step", "floor", *t, floor, 1.25, false);
      const double same = SameSizeFloor(bytes);
      f.extra = {{"floor_bytes", bytes},
                 {"bandwidth_bytes_per_s", bw},
                 {"same_size_floor_s", same},
                 {"step_over_same_size_floor", f.a / same}};
      rows->push_back(f);
    }
    rows->push_back(Ratio("Q5-bf16", m + ": bf16 step vs hidden-state memory (the original code's speed)", "bf16 step",
                          "hidden-state mems step", tbf, base, 20, true));
    rows->push_back(Ratio("Q5-int8", m + ": int8 step vs hidden-state memory (the original code's speed)", "int8 step",
                          "hidden-state mems step", ti8, base, 30, true));
    rows->back().extra = {{"float32_step_over_baseline", Median(base) / Median(t32)}};

    // Prefill: a 2048-token input into a fresh session (window mem + 1).
    const int64_t prefill = quick_ ? 64 : 2048;
    const std::vector<int> input = RandomTokens(prefill, 77);
    auto Prefill = [&](LanguageModel* lm) {
      auto s = Must(lm->NewSession(mem + 1), "new session");
      std::vector<StepInput> in(1);
      in[0].session = s.get();
      in[0].tokens = input;
      in[0].want_last_distribution = true;
      const auto start = Clock::now();
      auto out = Must(lm->Step(absl::MakeSpan(in)), "prefill");
      sink_ += out[0].last_distribution[0];
      return std::chrono::duration<double>(Clock::now() - start).count() / prefill;
    };
    Prefill(f32);
    Prefill(bf.get());
    Progress(absl::StrFormat("Q4: prefill of %d tokens", prefill));
    std::vector<double> p32, pbf;
    Interleave(
        z.reps, [&] { return Prefill(f32); }, [&] { return Prefill(bf.get()); }, &p32, &pbf);
    Row q4 = Throughput("Q4", absl::StrFormat("prefill of a %d-token input (window %d): bf16 vs float32", prefill, mem),
                        pbf, p32, 1, 3);
    q4.extra = {{"kernels", bf->KernelPath()}};
    rows->push_back(q4);

    // 32 sessions per step, aggregate tokens/s.
    const int N = z.sessions;
    Progress(absl::StrFormat("Q3: %d sessions per precision", N));
    auto fill = [&](LanguageModel* lm) {
      std::vector<std::unique_ptr<SessionState>> out;
      for (int i = 0; i < N; i += 4) {
        std::vector<StepInput> in;
        for (int j = i; j < std::min(N, i + 4); ++j) {
          out.push_back(Must(lm->NewSession(mem + 1), "new session"));
          StepInput x;
          x.session = out.back().get();
          x.tokens = RandomTokens(mem, 300 + j);
          in.push_back(std::move(x));
        }
        Must(lm->Step(absl::MakeSpan(in)), "filling sessions");
      }
      return out;
    };
    auto many32 = fill(f32), manybf = fill(bf.get());
    std::vector<SessionState*> a32, abf;
    for (auto& s : many32) a32.push_back(s.get());
    for (auto& s : manybf) abf.push_back(s.get());
    EngineSteps(a32, 1, f32);
    EngineSteps(abf, 1, bf.get());
    // The probe pass interleaved too, for Q3f's floors below.
    std::vector<double> m32, mbf, mpass;
    for (int r = 0; r < z.reps; ++r) {
      mbf.push_back(EngineSteps(abf, z.multi_batch, bf.get()));
      m32.push_back(EngineSteps(a32, z.multi_batch, f32));
      mpass.push_back(BandwidthPass(probe, 3));
    }
    Row q3 = Throughput(
        "Q3", absl::StrFormat("aggregate tokens/s, %d sessions per step (memory %d): bf16 vs float32", N, mem), mbf,
        m32, N, 1.8);
    q3.extra = {{"memory_bytes_per_session_bf16", manybf[0]->memory_bytes()},
                {"memory_bytes_per_session_float32", many32[0]->memory_bytes()}};
    rows->push_back(q3);
    // Q3f: each 32-session step against the bytes it must read (the weights
    // once, every session's keys and values), at the probe's DRAM rate. Both
    // steps are bound by these bytes, so Q3 cannot exceed the floors' ratio.
    const int64_t kv32 = config_.n_layer * 2 * mem * config_.n_head * config_.d_head * 4;
    const int64_t floor32 = FloorBytes(mem) + (N - 1) * kv32;
    const int64_t floorbf = ReducedFloorBytes(mem, 2, 2) + (N - 1) * kv32 / 2;
    for (auto [id, t, bytes] : {std::tuple{"Q3f-bf16", &mbf, floorbf}, std::tuple{"Q3f-float32", &m32, floor32}}) {
      std::vector<double> floor;
      for (double p : mpass) floor.push_back(bytes * p / probe_bytes);
      Row f = Ratio(id,
                    absl::StrFormat("%d-session %s step vs its bandwidth floor (%.1f MB / measured bandwidth)", N,
                                    id + 4, bytes / 1e6),
                    "step", "floor", *t, floor, 1.25, false);
      f.extra = {{"floor_bytes", bytes},
                 {"bandwidth_bytes_per_s", probe_bytes / Median(mpass)},
                 {"q3_ceiling_floor_ratio", static_cast<double>(floor32) / floorbf}};
      rows->push_back(f);
    }
  }

  void set_quick(bool q) { quick_ = q; }
  void set_only(std::vector<std::string> only) { only_ = std::move(only); }
  bool Want(const std::string& group) const {
    return only_.empty() || std::find(only_.begin(), only_.end(), group) != only_.end();
  }
  double sink() const { return sink_; }

 private:
  Sizes sizes_;
  std::string path_;
  std::string device_;
  txl::Kernels kernels_;
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
  txl::Sampler top_p_{txl::SamplingConfig{0.8f, 0, 0.9f, 7}, 7};
  txl::Sampler top_k_{txl::SamplingConfig{0.8f, 40, 0.0f, 7}, 7};
  double load_seconds_ = 0;
  int64_t rss_after_load_ = 0;
};

std::string Fmt(const std::string& unit, double v) {
  if (unit == "ms/step") return absl::StrFormat("%.3f ms", v * 1e3);
  if (unit == "tokens/s") return absl::StrFormat("%.1f tok/s", v);
  if (unit == "s") return absl::StrFormat("%.2f s", v);
  return absl::StrFormat("%.3f MB", v);
}

}  // namespace

int main(int argc, char** argv) {
  // libgomp reads its wait policy when it loads. Its default spins idle
  // threads, which on shared cores stalls every parallel region behind a
  // descheduled sibling (measured: an engine step ~10x slower on 2 busy
  // cores). Unless the caller chose one, run again with PASSIVE.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);
    Fail("re-running with OMP_WAIT_POLICY=PASSIVE failed");
  }
  txl::ListOwnFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  const std::string shape = absl::GetFlag(FLAGS_shape);
  const std::string device = absl::GetFlag(FLAGS_device);
  const int threads = absl::GetFlag(FLAGS_threads);
  const bool quick = absl::GetFlag(FLAGS_quick);
  if (device != "cpu" && device.rfind("cuda", 0) != 0) Fail("--device must be cpu or cuda");
  if (device != "cpu" && !torch::cuda::is_available())
    Fail("--device " + device + ": this libtorch has no CUDA support or no GPU is visible");
  if (threads < 1) Fail("--threads must be >= 1");
  const auto kernels_or = txl::ParseKernels(absl::GetFlag(FLAGS_kernels));
  if (!kernels_or.ok()) Fail(std::string(kernels_or.status().message()));
  const txl::Kernels kernels = *kernels_or;
  if (absl::GetFlag(FLAGS_reps) < 1) Fail("--reps must be >= 1");
  txl::SetThreads(threads);

  std::string path, temp;
  if (shape == "base") {
    // enwik8 base geometry with a 204-symbol vocabulary, random weights.
    txl::ModelConfig c;
    c.n_layer = 12;
    c.d_model = 512;
    c.n_head = 8;
    c.d_head = 64;
    c.d_inner = 2048;
    c.n_token = 204;
    c.mem_len = 800;
    std::vector<std::string> symbols;
    for (int i = 0; i < 204; ++i) symbols.push_back("w" + std::to_string(i));
    txl::Tokenizer tok = Must(txl::Tokenizer::WordFromSymbols(symbols), "tokenizer");
    char dir[] = "/tmp/engine_bench.XXXXXX";
    if (mkdtemp(dir) == nullptr) Fail("cannot make a temporary directory");
    temp = dir;
    path = temp + "/base.pt";
    absl::Status s = txl::WriteInitialCheckpoint(path, c, tok, /*seed=*/1);
    if (!s.ok()) Fail("writing the base checkpoint: " + s.ToString());
  } else if (shape == "wt103") {
    // The WikiText-103 model's shape (the original run_wt103_large.sh, the
    // transfo-xl-wt103 config): 18 layers, 16 heads x 64, d_model 1024,
    // d_inner 4096, an adaptive softmax over 267,735 words (div_val 4,
    // cutoffs 20000 / 40000 / 200000, projections tied except the head's),
    // untied u/v biases, mem_len 1600, clamp_len 1000. Random weights.
    txl::ModelConfig c;
    c.n_layer = 18;
    c.d_model = 1024;
    c.n_head = 16;
    c.d_head = 64;
    c.d_inner = 4096;
    c.n_token = 267735;
    c.cutoffs = {20000, 40000, 200000};
    c.div_val = 4;
    c.tie_projs = {false, true, true, true};
    c.untie_r = true;
    c.mem_len = 1600;
    c.clamp_len = 1000;
    if (quick) {  // the vocabulary and clusters, on a small trunk
      c.n_layer = 2;
      c.d_model = 256;
      c.n_head = 4;
      c.d_inner = 512;
    }
    std::vector<std::string> symbols;
    symbols.reserve(c.n_token);
    for (int64_t i = 0; i < c.n_token; ++i) symbols.push_back("w" + std::to_string(i));
    txl::Tokenizer tok = Must(txl::Tokenizer::WordFromSymbols(symbols), "tokenizer");
    char dir[] = "/tmp/engine_bench.XXXXXX";
    if (mkdtemp(dir) == nullptr) Fail("cannot make a temporary directory");
    temp = dir;
    path = temp + "/wt103.pt";
    // Random weights give every row a flat distribution (entropy ln V, 12.5
    // nats), the worst case for the readouts that adapt to the distribution
    // (greedy's cluster skipping, top-p's nucleus). Scaling the head's
    // projection peaks it as training does; W3 reports the entropy it got.
    txl::TxlWeights w = txl::InitWeights(c, /*seed=*/1);
    w.out_projs[0].mul_(absl::GetFlag(FLAGS_head_scale));
    absl::Status s = txl::SaveCheckpoint(path, c, tok, w);
    if (!s.ok()) Fail("writing the wt103 checkpoint: " + s.ToString());
  } else if (shape == "small") {
    path = absl::GetFlag(FLAGS_model).empty() ? std::string(TXL_BUNDLED_MODEL) : absl::GetFlag(FLAGS_model);
    if (path.empty()) Fail("--shape small needs --model (no bundled model compiled in)");
  } else {
    Fail("--shape must be base, wt103 or small");
  }

  Sizes z;
  z.reps = absl::GetFlag(FLAGS_reps);
  z.sessions = absl::GetFlag(FLAGS_sessions);
  if (z.sessions < 1) Fail("--sessions must be >= 1");
  if (quick) {
    z.mem = 32;
    z.windows = {32, 128};
    z.w_mems = {32, 64};
    z.sessions = std::min(z.sessions, 4);
    z.reps = 2;
    z.engine_batch = 3;
    z.baseline_batch = 1;
    z.multi_batch = 2;
  }

  if (shape == "small" && !quick) {
    // The model's own memory length.
    z.mem = Must(txl::LoadCheckpoint(path), "loading " + path).config.mem_len;
  }
  std::vector<Row> rows;
  auto b = std::make_unique<Bench>(path, device, kernels, threads, z);
  b->set_quick(quick);
  b->set_only(absl::GetFlag(FLAGS_only));
  try {
    rows = b->Run();
  } catch (const c10::Error& e) {
    Fail(std::string("torch error: ") + e.what_without_backtrace());
  }
  if (!temp.empty()) {
    std::remove(path.c_str());
    rmdir(temp.c_str());
  }

  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::cout << absl::StrFormat(
      "\nengine_bench: shape %s, device %s, %d threads, OMP_WAIT_POLICY=%s, %d reps%s, %s, %u cpus\n\n", shape, device,
      threads, wait_policy, z.reps, quick ? " (quick)" : "", CpuModel(), std::thread::hardware_concurrency());
  std::cout << "| id | measurement | A | B | ratio | target | met |\n|---|---|---|---|---|---|---|\n";
  nlohmann::json rows_json = nlohmann::json::array();
  for (const Row& r : rows) {
    const std::string ratio = r.at_least ? absl::StrFormat("%.1fx", r.ratio) : absl::StrFormat("%.3f", r.ratio);
    const std::string target = r.at_least ? absl::StrFormat(">= %gx", r.target) : absl::StrFormat("<= %g", r.target);
    std::cout << absl::StrFormat("| %s | %s | %s: %s | %s: %s | %s | %s | %s |\n", r.id, r.measurement, r.a_name,
                                 Fmt(r.unit, r.a), r.b_name, Fmt(r.b_unit.empty() ? r.unit : r.b_unit, r.b), ratio,
                                 target, r.met() ? "yes" : "NO");
    rows_json.push_back({{"id", r.id},
                         {"measurement", r.measurement},
                         {"a_name", r.a_name},
                         {"b_name", r.b_name},
                         {"unit", r.unit == "ms/step" ? "seconds/step" : r.unit},
                         {"b_unit", r.b_unit.empty() ? (r.unit == "ms/step" ? "seconds/step" : r.unit) : r.b_unit},
                         {"a", r.a},
                         {"b", r.b},
                         {"ratio", r.ratio},
                         {"target", r.target},
                         {"target_is_lower_bound", r.at_least},
                         {"met", r.met()},
                         {"a_reps", r.a_reps},
                         {"b_reps", r.b_reps},
                         {"extra", r.extra}});
  }
  std::cout << "\nA and B interleaved; medians of repetitions; absolute figures for reference only.\n";
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    nlohmann::json j = {
        {"benchmark", "engine_bench"},
        {"shape", shape},
        {"device", device},
        {"kernels", txl::KernelsName(kernels)},
        {"threads", threads},
        {"omp_wait_policy", wait_policy},
        {"reps", z.reps},
        {"quick", quick},
        {"machine", {{"host", host}, {"cpu", CpuModel()}, {"cpus", std::thread::hardware_concurrency()}}},
        {"memory_positions", z.mem},
        {"windows", z.windows},
        {"sessions", z.sessions},
        {"rows", rows_json},
        {"checksum", b->sink()}};
    std::ofstream f(json_path);
    f << j.dump(2) << "\n";
    if (!f) Fail("writing " + json_path);
  }
  return 0;
}
