// txl-eval: feeds a token stream through one session and reports its
// log-likelihood. Also the offline perplexity tool for users.
#include <chrono>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/flags_help.h"
#include "base/read_file.h"
#include "model/net/language_model.h"
#include "nlohmann/json.hpp"
#include "tools/cli_util.h"

ABSL_FLAG(std::string, model, "", "checkpoint file (TorchScript archive)");
ABSL_FLAG(std::string, text, "", "text file, encoded with the model's tokenizer");
ABSL_FLAG(std::string, tokens, "", "file of whitespace-separated token ids");
ABSL_FLAG(int64_t, mem_len, -1, "attention window in keys (-1: the model's mem_len)");
ABSL_FLAG(int64_t, chunk, 0, "tokens fed per request (0: all at once)");
ABSL_FLAG(std::string, logprobs, "", "write log p(t_i | t_<i) for i = 1..n-1, one per line");
ABSL_FLAG(std::string, predictions, "", "write the most likely token id at each position 1..n-1, one per line");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(int, threads, 0, "intra-op threads (0: libtorch default)");
ABSL_FLAG(std::string, dtype, "float32",
          "weights of the layers' products: float32 (exact), bfloat16 or int8 (per-row scales)");
ABSL_FLAG(std::string, kv_dtype, "float32", "sessions' keys and values: float32 or bfloat16 (half the bytes)");
ABSL_FLAG(std::string, kernels, "auto",
          "auto (the CPU's own kernels on a CPU, libtorch ops on a GPU) or generic (libtorch ops everywhere: "
          "the GPU's code, on a CPU too; slower there)");
ABSL_FLAG(std::string, cuda_graphs, "auto",
          "decode steps (one token per session) and small multi-token passes (up to 2,048 padded tokens: "
          "scoring segments, prefill chunks) as CUDA graphs, captured once per bucket of sessions, tokens and "
          "keys and replayed: auto (on a GPU), on or off. On a CPU, 'on' needs --kernels generic, where the "
          "same padded passes run eagerly (for testing)");
ABSL_FLAG(bool, sdpa_pass_attention, false,
          "the generic path's multi-token passes attend through one fused scaled_dot_product_attention (libtorch "
          "2.1 or later: the CUDA build; docs/MODEL.md, \"The pass attention as one fused product\")");

namespace {

int Fail(int code, const std::string& msg) {
  std::cerr << "txl-eval: " << msg << "\n";
  return code;
}

absl::StatusOr<std::vector<int>> ParseIds(const std::string& text, const std::string& path) {
  std::vector<int> ids;
  int64_t index = 0;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty())) {
    int id;
    if (!absl::SimpleAtoi(word, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token ", index, " is not an integer: '", word, "'"));
    }
    ids.push_back(id);
    ++index;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  txl::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage(
      "txl-eval --model M (--text FILE | --tokens FILE) [--mem_len N] [--chunk K] "
      "[--logprobs OUT] [--predictions OUT] [--device D] [--dtype float32|bfloat16|int8] "
      "[--kv_dtype float32|bfloat16] [--kernels auto|generic]");
  absl::ParseCommandLine(argc, argv);
  const std::string model_path = absl::GetFlag(FLAGS_model);
  const std::string text_path = absl::GetFlag(FLAGS_text), ids_path = absl::GetFlag(FLAGS_tokens);
  const int64_t chunk = absl::GetFlag(FLAGS_chunk);
  if (model_path.empty()) return Fail(2, "--model is required");
  if (text_path.empty() == ids_path.empty()) return Fail(2, "give exactly one of --text or --tokens");
  if (chunk < 0) return Fail(2, absl::StrCat("--chunk must be >= 0, got ", chunk));

  txl::LanguageModelOptions options;
  options.path = model_path;
  options.device = absl::GetFlag(FLAGS_device);
  options.threads = absl::GetFlag(FLAGS_threads);
  // Bad names are flag errors (exit 2); the parsers' messages name the flag.
  auto dtype = txl::ParseWeightDtype(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return Fail(2, std::string(dtype.status().message()));
  auto kv_dtype = txl::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return Fail(2, std::string(kv_dtype.status().message()));
  auto kernels = txl::ParseKernels(absl::GetFlag(FLAGS_kernels));
  if (!kernels.ok()) return Fail(2, std::string(kernels.status().message()));
  options.dtype = *dtype;
  options.kv_dtype = *kv_dtype;
  options.kernels = *kernels;
  auto graphs = txl::ParseDecodeGraphs(absl::GetFlag(FLAGS_cuda_graphs));
  if (!graphs.ok()) return Fail(2, std::string(graphs.status().message()));
  options.decode_graphs = *graphs;
  options.sdpa_pass_attention = absl::GetFlag(FLAGS_sdpa_pass_attention);
  auto model = txl::LanguageModel::Create(options);
  if (!model.ok()) return Fail(1, std::string(model.status().message()));

  auto input = txl::ReadFile(text_path.empty() ? ids_path : text_path);
  if (!input.ok()) return Fail(1, std::string(input.status().message()));
  absl::StatusOr<std::vector<int>> ids =
      text_path.empty() ? ParseIds(*input, ids_path) : (*model)->tokenizer().Encode(*input);
  if (!ids.ok()) return Fail(1, std::string(ids.status().message()));
  const int64_t n = static_cast<int64_t>(ids->size());
  if (n < 2) return Fail(1, absl::StrCat("need at least 2 tokens to score, got ", n));

  const int64_t mem_len = absl::GetFlag(FLAGS_mem_len) < 0 ? (*model)->config().mem_len : absl::GetFlag(FLAGS_mem_len);
  auto session = (*model)->NewSession(mem_len);
  if (!session.ok()) return Fail(2, std::string(session.status().message()));

  const auto start = std::chrono::steady_clock::now();
  const int64_t step = chunk == 0 ? n : chunk;
  std::vector<float> logprobs;
  std::vector<int> predicted;
  logprobs.reserve(n - 1);
  for (int64_t s = 0; s < n; s += step) {
    const int64_t e = std::min(n, s + step);
    txl::StepInput in;
    in.session = session->get();
    in.tokens.assign(ids->begin() + s, ids->begin() + e);
    in.targets.assign(ids->begin() + s + 1, ids->begin() + std::min(e + 1, n));
    in.want_target_argmax = true;  // the accuracy below
    auto out = (*model)->Step(absl::MakeSpan(&in, 1));
    if (!out.ok()) return Fail(1, std::string(out.status().message()));
    const txl::StepOutput& o = (*out)[0];
    logprobs.insert(logprobs.end(), o.target_logprobs.begin(), o.target_logprobs.end());
    predicted.insert(predicted.end(), o.target_argmax.begin(), o.target_argmax.end());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  double nll = 0;
  for (float lp : logprobs) nll -= lp;
  const double per_token = nll / static_cast<double>(n - 1);
  if (const std::string out_path = absl::GetFlag(FLAGS_logprobs); !out_path.empty()) {
    std::string text;
    for (float lp : logprobs) absl::StrAppendFormat(&text, "%.9g\n", lp);
    if (auto s = txl::WriteFile(out_path, text); !s.ok()) return Fail(1, std::string(s.message()));
  }
  if (const std::string out_path = absl::GetFlag(FLAGS_predictions); !out_path.empty()) {
    std::string text;
    for (int id : predicted) absl::StrAppend(&text, id, "\n");
    if (auto s = txl::WriteFile(out_path, text); !s.ok()) return Fail(1, std::string(s.message()));
  }
  nlohmann::json j = {{"tokens", n},
                      {"predicted", n - 1},
                      {"nll", nll},
                      {"bpc", per_token / std::log(2.0)},
                      {"ppl", std::exp(per_token)},
                      {"mem_len", mem_len},
                      {"chunk", chunk},
                      {"device", (*model)->device()},
                      {"dtype", txl::DtypeName((*model)->dtype())},
                      {"kv_dtype", txl::DtypeName((*model)->kv_dtype())},
                      {"kernels", txl::KernelsName(options.kernels)},
                      {"kernel_path", (*model)->KernelPath()},  // after the run: names a failed graph capture
                      {"seconds", seconds},
                      {"tokens_per_second", n / std::max(seconds, 1e-9)}};
  std::cout << j.dump() << std::endl;
  return 0;
}
