// engine_bench: group W, the output side of a large vocabulary (meant for
// --shape wt103; any shape runs it): one session's greedy step vs its
// bandwidth floor, each readout's share of a 32-session step, start-up.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/engine_bench.h"

namespace engine_bench {

// ---- W: the output side of a large vocabulary (--shape wt103; any shape
// runs it). W1-<mem>: one session's greedy step vs its bandwidth floor.
// W3-*: N sessions at the first memory, each readout's step vs the layers
// alone: the share of the step after the last layer's hidden states. W5:
// start-up (load time, RSS).
void Bench::WRows(std::vector<Row>* rows) {
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
                                                   {Readout::kDrawAllowingMost, "constrained-most"},
                                                   {Readout::kDrawAllowingFew, "constrained-few"},
                                                   {Readout::kDrawAllowingFewSpread, "constrained-spread"},
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

}  // namespace engine_bench
