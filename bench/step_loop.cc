// step_loop: a loop of decode steps and nothing else, for profilers
// (docs/PERFORMANCE.md, "Where a step's time goes now"):
//   OMP_WAIT_POLICY=PASSIVE perf record -D 30000 build/bench/step_loop --model base.pt --sessions 32
// On a GPU, --profile prints the device's time by kernel from libtorch's own
// profiler (docs/GPU.md):
//   step_loop --model base.pt --device cuda --readout argmax --sessions 32 --profile trace.json
// It fills `sessions` sessions to a full window (prefill), then times
// `steps` single-token steps of all of them at once and prints the median.
// With --prefill N it times `steps` prefills of N tokens instead, each into
// a fresh session (engine_bench's Q4), and --profile profiles more of them.
// engine_bench has the figures; this is only the workload to look inside.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/flags_help.h"
#include "base/malloc_tuning.h"
#include "bench/kineto_profile.h"
#include "model/net/language_model.h"

ABSL_FLAG(std::string, model, "", "checkpoint (e.g. the base model engine_bench writes; required)");
ABSL_FLAG(int, sessions, 1, "sessions stepped together");
ABSL_FLAG(int, mem, 800, "memory positions per session (window mem + 1)");
ABSL_FLAG(int, steps, 300, "timed steps");
ABSL_FLAG(int64_t, malloc_keep_bytes, int64_t{256} << 20,
          "freed memory glibc keeps for reuse, as txl-server's flag of that name (0: glibc's defaults)");
ABSL_FLAG(int, threads, 2, "intra-op threads");
ABSL_FLAG(int, prefill, 0, "time prefills of this many tokens (one fresh session each) instead of steps");
ABSL_FLAG(int, feed, 1,
          "tokens each of the first --feeders sessions feeds per timed step (the others feed 1): a step that "
          "starts a turn, where a session feeds its pending token and the new input");
ABSL_FLAG(int, feeders, -1, "sessions that feed --feed tokens per step (-1: all)");
ABSL_FLAG(std::string, dtype, "float32",
          "weights of the layers' products: float32 (exact), bfloat16 or int8 (per-row scales)");
ABSL_FLAG(std::string, kv_dtype, "float32", "sessions' keys and values: float32 or bfloat16 (half the bytes)");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, kernels, "auto", "auto, or generic (libtorch's ops, the GPU's code path, on a CPU)");
ABSL_FLAG(std::string, cuda_graphs, "auto",
          "decode steps and small multi-token passes as CUDA graphs: auto (on a GPU), on or off");
ABSL_FLAG(bool, split_decode_attention, true,
          "the generic path's decode attention fused over key chunks (false: libtorch's tensor ops)");
ABSL_FLAG(bool, decode_short_feeds, true,
          "on the CPU kernels, a session feeding a few tokens feeds them a decode pass at a time (false: any "
          "session feeding several tokens takes the step through the multi-token pass)");
ABSL_FLAG(bool, bf16_activations, true,
          "with --dtype bfloat16 on the generic path, bfloat16 between the layers' products (false: float32, each "
          "product converting its input and its output)");
ABSL_FLAG(bool, sdpa_pass_attention, false,
          "the generic path's multi-token passes attend through one fused scaled_dot_product_attention, the "
          "relative-position scores its additive mask (libtorch 2.x: the CUDA build)");
ABSL_FLAG(bool, fused_add_norm, true,
          "a post-norm model's residual adds fused with their layer norms on the generic path, one kernel each "
          "(false: libtorch's add and layer_norm)");
ABSL_FLAG(int64_t, skinny_max_rows, txl::kSkinnyMaxRows,
          "the generic path's products of up to this many rows (decode steps of as many sessions), 0 to 32, by "
          "txl-serve's own kernel, SkinnyProduct (float32 weights, or bfloat16 with bfloat16 activations); more "
          "rows, or 0, by libtorch's (cuBLAS on a GPU)");
ABSL_FLAG(std::string, readout, "distribution",
          "what each step reads out: distribution (each session's whole row, to the host), argmax (the model's "
          "greedy pick: one id per session crosses) or score (every fed token's target log-prob, as Score: with "
          "--feed 64 --mem 640, NVIDIA's published scoring setting)");
ABSL_FLAG(std::string, profile, "",
          "after the timed steps, profile --profile_steps more under libtorch's profiler, print the device's time by "
          "kernel, and write Chrome's trace to this file (\"-\": no trace file)");
ABSL_FLAG(int, profile_steps, 20, "steps under --profile");

int main(int argc, char** argv) {
  txl::ListOwnFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  // As txl-server sets it, so that the figures are the server's.
  if (absl::Status m = txl::TuneMalloc({1, absl::GetFlag(FLAGS_malloc_keep_bytes)}); !m.ok()) {
    std::cerr << "warning: " << m.message() << "\n";
  }
  txl::LanguageModelOptions o;
  o.path = absl::GetFlag(FLAGS_model);
  o.threads = absl::GetFlag(FLAGS_threads);
  auto dtype = txl::ParseWeightDtype(absl::GetFlag(FLAGS_dtype));
  auto kv_dtype = txl::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
  for (const absl::Status& s : {dtype.status(), kv_dtype.status()}) {
    if (!s.ok()) {
      std::cerr << "step_loop: " << s.message() << "\n";
      return 2;
    }
  }
  o.dtype = *dtype;
  o.kv_dtype = *kv_dtype;
  o.device = absl::GetFlag(FLAGS_device);
  auto kernels = txl::ParseKernels(absl::GetFlag(FLAGS_kernels));
  auto graphs = txl::ParseDecodeGraphs(absl::GetFlag(FLAGS_cuda_graphs));
  const std::string readout = absl::GetFlag(FLAGS_readout);
  for (const absl::Status& s : {kernels.status(), graphs.status()}) {
    if (!s.ok()) {
      std::cerr << "step_loop: " << s.message() << "\n";
      return 2;
    }
  }
  if (readout != "distribution" && readout != "argmax" && readout != "score") {
    std::cerr << "step_loop: --readout is distribution, argmax or score, not " << readout << "\n";
    return 2;
  }
  o.kernels = *kernels;
  o.decode_graphs = *graphs;
  o.split_decode_attention = absl::GetFlag(FLAGS_split_decode_attention);
  o.decode_short_feeds = absl::GetFlag(FLAGS_decode_short_feeds);
  o.bf16_activations = absl::GetFlag(FLAGS_bf16_activations);
  o.sdpa_pass_attention = absl::GetFlag(FLAGS_sdpa_pass_attention);
  o.fused_add_norm = absl::GetFlag(FLAGS_fused_add_norm);
  o.skinny_max_rows = absl::GetFlag(FLAGS_skinny_max_rows);
  auto lm = txl::LanguageModel::Create(o);
  if (!lm.ok()) {
    std::cerr << "step_loop: " << lm.status() << "\n";
    return 1;
  }
  // Which kernels a profile of this run looks at.
  const std::string path = (*lm)->KernelPath();
  std::cerr << "step_loop: kernels " << path << std::endl;
  // A graph capture that fails falls back to eager passes and says so in the
  // path: printed again when it changed, so that a timing says what it timed.
  auto path_after = [&] {
    if (const std::string now = (*lm)->KernelPath(); now != path) std::cerr << "step_loop: kernels now " << now << "\n";
  };
  const int B = absl::GetFlag(FLAGS_sessions), mem = absl::GetFlag(FLAGS_mem);
  const int vocab = static_cast<int>((*lm)->config().n_token);
  auto fail = [](const absl::Status& s) {
    std::cerr << "step_loop: " << s << "\n";
    return 1;
  };
  // Seconds of one Step of `in`.
  std::vector<double> seconds;
  auto timed = [&](std::vector<txl::StepInput>& in) {
    const auto start = std::chrono::steady_clock::now();
    const absl::Status s = (*lm)->Step(absl::MakeSpan(in)).status();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return s;
  };
  auto median = [&] {
    std::sort(seconds.begin(), seconds.end());
    return seconds[seconds.size() / 2];
  };
  if (absl::GetFlag(FLAGS_profile_steps) < 1) {
    std::cerr << "step_loop: --profile_steps must be at least 1\n";
    return 2;
  }
  step_loop::ProfileConfig pc;
  pc.steps = absl::GetFlag(FLAGS_profile_steps);
  pc.trace = absl::GetFlag(FLAGS_profile) == "-" ? "" : absl::GetFlag(FLAGS_profile);
  if (const int n = absl::GetFlag(FLAGS_prefill); n > 0) {
    int i = 0;  // a fresh session each, its prompt differing by i
    auto prefill = [&](bool time) {
      auto s = (*lm)->NewSession(mem + 1);
      if (!s.ok()) return s.status();
      std::vector<txl::StepInput> in(1);
      in[0].session = s->get();
      for (int t = 0; t < n; ++t) in[0].tokens.push_back((t * 31 + i) % vocab);
      in[0].want_last_distribution = true;
      ++i;
      return time ? timed(in) : (*lm)->Step(absl::MakeSpan(in)).status();
    };
    for (int k = 0; k < absl::GetFlag(FLAGS_steps); ++k) {
      if (absl::Status st = prefill(true); !st.ok()) return fail(st);
    }
    const double m = median();
    std::printf("prefill of %d tokens, memory %d: median %.1f ms, %.1f tokens/s\n", n, mem, m * 1e3, n / m);
    if (!absl::GetFlag(FLAGS_profile).empty()) {
      if (absl::Status st = step_loop::ProfileSteps([&] { return prefill(false); }, pc, std::cout); !st.ok())
        return fail(st);
    }
    path_after();
    return 0;
  }
  std::vector<std::unique_ptr<txl::SessionState>> sessions;
  for (int b = 0; b < B; ++b) {
    auto s = (*lm)->NewSession(mem + 1);
    if (!s.ok()) return fail(s.status());
    std::vector<txl::StepInput> in(1);
    in[0].session = s->get();
    for (int i = 0; i < mem; ++i) in[0].tokens.push_back((i * 31 + b) % vocab);
    if (auto r = (*lm)->Step(absl::MakeSpan(in)); !r.ok()) return fail(r.status());
    sessions.push_back(*std::move(s));
  }
  std::cerr << "step_loop: filled " << B << " sessions; stepping" << std::endl;
  std::vector<txl::StepInput> in(B);
  const int feed = absl::GetFlag(FLAGS_feed);
  const int feeders = absl::GetFlag(FLAGS_feeders) < 0 ? B : absl::GetFlag(FLAGS_feeders);
  if (feed < 1) {
    std::cerr << "step_loop: --feed must be at least 1\n";
    return 2;
  }
  int step = 0;
  auto fill = [&] {
    for (int b = 0; b < B; ++b) {
      in[b] = txl::StepInput();
      in[b].session = sessions[b].get();
      in[b].tokens = {(step * 7 + b) % vocab};
      if (b < feeders) {
        for (int t = 1; t < feed; ++t) in[b].tokens.push_back((step * 7 + b + t) % vocab);
      }
      if (readout == "argmax") {
        in[b].plan.pick = txl::SamplingPlan::Pick::kArgmax;
      } else if (readout == "score") {
        for (size_t t = 0; t < in[b].tokens.size(); ++t) in[b].targets.push_back((in[b].tokens[t] + 1) % vocab);
      } else {
        in[b].want_last_distribution = true;
      }
    }
    ++step;
  };
  for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) {
    fill();
    if (absl::Status st = timed(in); !st.ok()) return fail(st);
  }
  const double m = median();
  const int fed = B + std::min(feeders, B) * (feed - 1);
  std::printf("sessions %d, memory %d: median step %.3f ms, %.1f tokens/s", B, mem, m * 1e3, fed / m);
  if (feed > 1) std::printf(" (%d of them feeding %d tokens a step)", std::min(feeders, B), feed);
  std::printf("\n");
  if (!absl::GetFlag(FLAGS_profile).empty()) {
    const absl::Status st = step_loop::ProfileSteps(
        [&] {
          fill();
          return (*lm)->Step(absl::MakeSpan(in)).status();
        },
        pc, std::cout);
    if (!st.ok()) return fail(st);
  }
  path_after();
  return 0;
}
