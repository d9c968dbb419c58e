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
// G    (a GPU, or --kernels generic) decode steps with decode graphs vs none,
//      one session (G1) and 32 (G3); A the same with the split decode
//      attention vs libtorch's tensor ops (A1, A3).
// --dtype / --kv_dtype: the model P1, P3, S, G and A measure in reduced
// precision (P1f against that precision's floor); the others refuse it.
// --sdpa_pass_attention: that model's passes attend through one fused
// product (S is the group it changes); the others refuse it too.
//
// The parts: engine_bench.h (Bench, the rows, what every group shares) and
// engine_bench_*.cc (Bench's methods by topic); this file holds the flags,
// the models measured (--shape), main and the output (table and --json).
#include <torch/cuda.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "base/flags_help.h"
#include "base/malloc_tuning.h"
#include "bench/engine_bench.h"
#include "model/net/checkpoint.h"
#include "model/net/language_model.h"
#include "model/net/weights.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

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
ABSL_FLAG(int64_t, malloc_keep_bytes, int64_t{256} << 20,
          "freed memory glibc keeps for reuse, as txl-server's flag of that name (0: glibc's defaults)");
ABSL_FLAG(int, threads, 2, "intra-op threads (model and bandwidth probe alike)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, kernels, "auto", "auto or generic (libtorch ops, the GPU's code, on a CPU too)");
ABSL_FLAG(std::string, cuda_graphs, "auto",
          "decode steps and small passes as CUDA graphs in every group but G (which compares on and off): auto "
          "(on a GPU), on "
          "or off; on a CPU, 'on' needs --kernels generic (the same padded steps, eagerly)");
ABSL_FLAG(int, reps, 5, "interleaved repetitions; medians are reported");
ABSL_FLAG(bool, quick, false, "tiny sizes and 2 repetitions: only checks that it works");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this file");
ABSL_FLAG(int, sessions, 32, "concurrent sessions for P3 and P5");
ABSL_FLAG(std::string, dtype, "float32",
          "the layers' product weights of the model P1, P3, S, G and A measure: float32, bfloat16 or int8 (the "
          "other groups need float32)");
ABSL_FLAG(std::string, kv_dtype, "float32", "that model's keys and values: float32 or bfloat16");
ABSL_FLAG(bool, sdpa_pass_attention, false,
          "that model's multi-token passes attend through one fused scaled_dot_product_attention (the generic "
          "path, libtorch 2.1 or later; docs/MODEL.md, \"The pass attention as one fused product\"); with --only "
          "P1,P3,S,G,A");
ABSL_FLAG(std::vector<std::string>, only, {}, "run only these groups (P1, P2, P3, S, Q, W, G, A)");

using engine_bench::Bench;
using engine_bench::Fail;
using engine_bench::Must;
using engine_bench::Row;
using engine_bench::Sizes;

namespace {

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

std::string Fmt(const std::string& unit, double v) {
  if (unit == "ms/step") return absl::StrFormat("%.3f ms", v * 1e3);
  if (unit == "tokens/s") return absl::StrFormat("%.1f tok/s", v);
  if (unit == "s") return absl::StrFormat("%.2f s", v);
  return absl::StrFormat("%.3f MB", v);
}

// libgomp reads its wait policy when it loads. Its default spins idle
// threads, which on shared cores stalls every parallel region behind a
// descheduled sibling (measured: an engine step ~10x slower on 2 busy
// cores). Unless the caller chose one, run again with PASSIVE.
void RerunWithPassiveWaitPolicy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);
    Fail("re-running with OMP_WAIT_POLICY=PASSIVE failed");
  }
}

// A word tokenizer over the symbols w0 .. w{n-1}.
txl::Tokenizer NumberedWords(int64_t n) {
  std::vector<std::string> symbols;
  symbols.reserve(n);
  for (int64_t i = 0; i < n; ++i) symbols.push_back("w" + std::to_string(i));
  return Must(txl::Tokenizer::WordFromSymbols(symbols), "tokenizer");
}

// A fresh /tmp/engine_bench.XXXXXX for a random model's checkpoint.
std::string TempDir() {
  char dir[] = "/tmp/engine_bench.XXXXXX";
  if (mkdtemp(dir) == nullptr) Fail("cannot make a temporary directory");
  return dir;
}

// --shape base: enwik8 base geometry with a 204-symbol vocabulary, random
// weights, written under a new temporary directory (`temp`); returns its path.
std::string WriteBaseModel(std::string* temp) {
  txl::ModelConfig c;
  c.n_layer = 12;
  c.d_model = 512;
  c.n_head = 8;
  c.d_head = 64;
  c.d_inner = 2048;
  c.n_token = 204;
  c.mem_len = 800;
  txl::Tokenizer tok = NumberedWords(204);
  *temp = TempDir();
  const std::string path = *temp + "/base.pt";
  absl::Status s = txl::WriteInitialCheckpoint(path, c, tok, /*seed=*/1);
  if (!s.ok()) Fail("writing the base checkpoint: " + s.ToString());
  return path;
}

// --shape wt103: the WikiText-103 model's shape (the original
// run_wt103_large.sh, the transfo-xl-wt103 config): 18 layers, 16 heads x
// 64, d_model 1024, d_inner 4096, an adaptive softmax over 267,735 words
// (div_val 4, cutoffs 20000 / 40000 / 200000, projections tied except the
// head's), untied u/v biases, mem_len 1600, clamp_len 1000. Random weights,
// written under a new temporary directory (`temp`); returns its path.
std::string WriteWt103Model(bool quick, std::string* temp) {
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
  txl::Tokenizer tok = NumberedWords(c.n_token);
  *temp = TempDir();
  const std::string path = *temp + "/wt103.pt";
  // Random weights give every row a flat distribution (entropy ln V, 12.5
  // nats), the worst case for the readouts that adapt to the distribution
  // (greedy's cluster skipping, top-p's nucleus). Scaling the head's
  // projection peaks it as training does; W3 reports the entropy it got.
  txl::TxlWeights w = txl::InitWeights(c, /*seed=*/1);
  w.out_projs[0].mul_(absl::GetFlag(FLAGS_head_scale));
  absl::Status s = txl::SaveCheckpoint(path, c, tok, w);
  if (!s.ok()) Fail("writing the wt103 checkpoint: " + s.ToString());
  return path;
}

// The checkpoint --shape measures; `temp`: the temporary directory written
// for it (left empty for --shape small).
std::string ModelPath(const std::string& shape, bool quick, std::string* temp) {
  if (shape == "base") return WriteBaseModel(temp);
  if (shape == "wt103") return WriteWt103Model(quick, temp);
  if (shape == "small") {
    const std::string path =
        absl::GetFlag(FLAGS_model).empty() ? std::string(TXL_BUNDLED_MODEL) : absl::GetFlag(FLAGS_model);
    if (path.empty()) Fail("--shape small needs --model (no bundled model compiled in)");
    return path;
  }
  Fail("--shape must be base, wt103 or small");
}

// The sizes of the measurements: --reps, --sessions, or --quick's tiny ones.
Sizes SizesFromFlags(bool quick) {
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
  return z;
}

// The table: one line per row, then the note on how to read it.
void PrintTable(const std::vector<Row>& rows) {
  std::cout << "| id | measurement | A | B | ratio | target | met |\n|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    const std::string ratio = r.at_least ? absl::StrFormat("%.1fx", r.ratio) : absl::StrFormat("%.3f", r.ratio);
    const std::string target = r.at_least ? absl::StrFormat(">= %gx", r.target) : absl::StrFormat("<= %g", r.target);
    std::cout << absl::StrFormat("| %s | %s | %s: %s | %s: %s | %s | %s | %s |\n", r.id, r.measurement, r.a_name,
                                 Fmt(r.unit, r.a), r.b_name, Fmt(r.b_unit.empty() ? r.unit : r.b_unit, r.b), ratio,
                                 target, r.met() ? "yes" : "NO");
  }
  std::cout << "\nA and B interleaved; medians of repetitions; absolute figures for reference only.\n";
}

// One row in --json (times in seconds, where the table shows ms).
nlohmann::json RowJson(const Row& r) {
  return {{"id", r.id},
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
          {"extra", r.extra}};
}

}  // namespace

int main(int argc, char** argv) {
  RerunWithPassiveWaitPolicy(argv);
  txl::ListOwnFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  // As txl-server sets it, so that the figures are the server's.
  if (absl::Status m = txl::TuneMalloc({1, absl::GetFlag(FLAGS_malloc_keep_bytes)}); !m.ok()) {
    std::cerr << "warning: " << m.message() << "\n";
  }
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
  const auto dtype_or = txl::ParseWeightDtype(absl::GetFlag(FLAGS_dtype));
  if (!dtype_or.ok()) Fail("--dtype: " + std::string(dtype_or.status().message()));
  const auto kv_or = txl::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_or.ok()) Fail("--kv_dtype: " + std::string(kv_or.status().message()));
  const bool reduced = *dtype_or != txl::WeightDtype::kFloat32 || *kv_or != txl::KvDtype::kFloat32;
  const bool sdpa = absl::GetFlag(FLAGS_sdpa_pass_attention);
  if (reduced || sdpa) {
    // P2 and W compare the engine with float32 baselines, Q the formats with each other.
    const std::vector<std::string> only = absl::GetFlag(FLAGS_only);
    const std::vector<std::string> allowed = {"P1", "P3", "S", "G", "A"};
    const bool fits = !only.empty() && std::all_of(only.begin(), only.end(), [&](const std::string& g) {
      return std::find(allowed.begin(), allowed.end(), g) != allowed.end();
    });
    if (!fits) {
      Fail(
          "--dtype/--kv_dtype other than float32 and --sdpa_pass_attention measure only --only P1,P3,S,G,A (or "
          "some of them)");
    }
  }
  txl::SetThreads(threads);

  std::string temp;
  const std::string path = ModelPath(shape, quick, &temp);
  Sizes z = SizesFromFlags(quick);
  if (shape == "small" && !quick) {
    // The model's own memory length.
    z.mem = Must(txl::LoadCheckpoint(path), "loading " + path).config.mem_len;
  }

  // The measurements.
  std::vector<Row> rows;
  const auto graphs_or = txl::ParseDecodeGraphs(absl::GetFlag(FLAGS_cuda_graphs));
  if (!graphs_or.ok()) Fail(std::string(graphs_or.status().message()));
  auto b = std::make_unique<Bench>(path, device, kernels, *graphs_or, threads, z, *dtype_or, *kv_or, sdpa);
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

  // The output: the table, and --json.
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::cout << absl::StrFormat(
      "\nengine_bench: shape %s, device %s, weights %s, memories %s%s, %d threads, OMP_WAIT_POLICY=%s, %d reps%s, %s, "
      "%u cpus\n\n",
      shape, device, absl::GetFlag(FLAGS_dtype), absl::GetFlag(FLAGS_kv_dtype),
      sdpa ? ", pass attention fused (scaled_dot_product_attention)" : "", threads, wait_policy, z.reps,
      quick ? " (quick)" : "", CpuModel(), std::thread::hardware_concurrency());
  PrintTable(rows);
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    nlohmann::json rows_json = nlohmann::json::array();
    for (const Row& r : rows) rows_json.push_back(RowJson(r));
    nlohmann::json j = {
        {"benchmark", "engine_bench"},
        {"shape", shape},
        {"device", device},
        {"kernels", txl::KernelsName(kernels)},
        {"dtype", absl::GetFlag(FLAGS_dtype)},
        {"kv_dtype", absl::GetFlag(FLAGS_kv_dtype)},
        {"sdpa_pass_attention", sdpa},
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
