// engine_bench groups G and A, on the generic path (a GPU, or --kernels
// generic on a CPU), interleaved in one run: one session (G1, A1) and N
// sessions (G3, A3), full windows, greedy readout (the model's argmax: a
// token id per session crosses to the host).
//   G: decode steps with the decode graphs (CUDA graphs on a GPU; the padded
//      passes run eagerly on a CPU) against the same model without them.
//   A: the decode attention split over key chunks (SplitDecodeAttention)
//      against libtorch's tensor ops, both with decode graphs.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "bench/engine_bench.h"

namespace engine_bench {

void Bench::GraphRows(std::vector<Row>* rows) {
  if (!cuda_ && kernels_ != txl::Kernels::kGeneric) {
    Progress("G, A: skipped (decode graphs and the split attention run on a GPU, or with --kernels generic)");
    return;
  }
  if (Want("G")) {
    Progress("G: loading the model with and without decode graphs");
    PairRows("G", "decode graphs vs none", "graphs", "no graphs", LoadWith(txl::DecodeGraphs::kOn, true),
             LoadWith(txl::DecodeGraphs::kOff, true), rows);
  }
  if (Want("A")) {
    Progress("A: loading the model with the split decode attention and with tensor ops");
    PairRows("A", "split decode attention vs tensor ops, decode graphs", "split", "tensor ops",
             LoadWith(txl::DecodeGraphs::kOn, true), LoadWith(txl::DecodeGraphs::kOn, false), rows);
  }
}

void Bench::PairRows(const std::string& group, const std::string& what, const std::string& a_name,
                     const std::string& b_name, std::unique_ptr<LanguageModel> with,
                     std::unique_ptr<LanguageModel> without, std::vector<Row>* rows) {
  const Sizes& z = sizes_;
  for (const int n : {1, z.sessions}) {
    Progress(absl::StrFormat("%s: %d session(s), memory %d", group, n, z.mem));
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
    r.id = group + (n == 1 ? "1" : "3");
    r.measurement = absl::StrFormat("%d session(s), 1 token/step, memory %d, greedy: %s", n, z.mem, what);
    r.a_name = a_name;
    r.b_name = b_name;
    r.unit = "ms/step";
    Interleave(
        z.reps, [&] { return ReadoutSteps(a, z.engine_batch, Readout::kArgmax, with.get()); },
        [&] { return ReadoutSteps(b, z.engine_batch, Readout::kArgmax, without.get()); }, &r.a_reps, &r.b_reps);
    r.a = Median(r.a_reps);
    r.b = Median(r.b_reps);
    r.ratio = r.b / r.a;
    r.target = 1;
    r.extra[absl::StrCat("tokens_per_second_", absl::StrReplaceAll(a_name, {{" ", "_"}}))] = n / r.a;
    r.extra[absl::StrCat("tokens_per_second_", absl::StrReplaceAll(b_name, {{" ", "_"}}))] = n / r.b;
    r.extra["sessions"] = n;
    rows->push_back(r);
  }
}

std::unique_ptr<LanguageModel> Bench::LoadWith(txl::DecodeGraphs decode_graphs, bool split_decode_attention) const {
  txl::LanguageModelOptions o;
  o.path = path_;
  o.device = device_;
  o.kernels = kernels_;
  o.decode_graphs = decode_graphs;
  o.split_decode_attention = split_decode_attention;
  o.dtype = dtype_;
  o.kv_dtype = kv_dtype_;
  o.sdpa_pass_attention = sdpa_pass_attention_;
  return Must(LanguageModel::Create(o), "loading " + path_);
}

}  // namespace engine_bench
