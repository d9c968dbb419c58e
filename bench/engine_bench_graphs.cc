// engine_bench group G: decode steps with the decode graphs (CUDA graphs on
// a GPU; the padded passes run eagerly with --kernels generic on a CPU)
// against the same model without them, interleaved in one run: one session
// (G1) and N sessions (G3), full windows, greedy readout (the model's
// argmax: a token id per session crosses to the host).
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/engine_bench.h"

namespace engine_bench {

void Bench::GraphRows(std::vector<Row>* rows) {
  if (!cuda_ && kernels_ != txl::Kernels::kGeneric) {
    Progress("G: skipped (decode graphs run on a GPU, or with --kernels generic)");
    return;
  }
  Progress("G: loading the model with and without decode graphs");
  auto with = LoadWith(txl::DecodeGraphs::kOn), without = LoadWith(txl::DecodeGraphs::kOff);
  const Sizes& z = sizes_;
  for (const int n : {1, z.sessions}) {
    Progress(absl::StrFormat("G: %d session(s), memory %d", n, z.mem));
    std::vector<std::unique_ptr<SessionState>> a_own, b_own;
    std::vector<SessionState*> a, b;
    for (int i = 0; i < n; ++i) {
      a_own.push_back(FullSession(z.mem + 1, 40 + i, with.get()));
      b_own.push_back(FullSession(z.mem + 1, 40 + i, without.get()));
      a.push_back(a_own.back().get());
      b.push_back(b_own.back().get());
    }
    // Warm-up: every bucket these steps reach is captured here.
    ReadoutSteps(a, 4, Readout::kArgmax, with.get());
    ReadoutSteps(b, 4, Readout::kArgmax, without.get());
    Row r;
    r.id = n == 1 ? "G1" : "G3";
    r.measurement = absl::StrFormat("%d session(s), 1 token/step, memory %d, greedy: decode graphs vs none", n, z.mem);
    r.a_name = "graphs";
    r.b_name = "no graphs";
    r.unit = "ms/step";
    Interleave(
        z.reps, [&] { return ReadoutSteps(a, z.engine_batch, Readout::kArgmax, with.get()); },
        [&] { return ReadoutSteps(b, z.engine_batch, Readout::kArgmax, without.get()); }, &r.a_reps, &r.b_reps);
    r.a = Median(r.a_reps);
    r.b = Median(r.b_reps);
    r.ratio = r.b / r.a;
    r.target = 1;
    r.extra["tokens_per_second_graphs"] = n / r.a;
    r.extra["tokens_per_second_no_graphs"] = n / r.b;
    r.extra["sessions"] = n;
    rows->push_back(r);
  }
}

std::unique_ptr<LanguageModel> Bench::LoadWith(txl::DecodeGraphs decode_graphs) const {
  txl::LanguageModelOptions o;
  o.path = path_;
  o.device = device_;
  o.kernels = kernels_;
  o.decode_graphs = decode_graphs;
  return Must(LanguageModel::Create(o), "loading " + path_);
}

}  // namespace engine_bench
