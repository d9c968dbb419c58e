// txl-init: writes a freshly initialised checkpoint (random weights with the
// original init) for a config and a tokenizer. Used by tests and benchmarks.
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "base/flags_help.h"
#include "base/read_file.h"
#include "model/net/checkpoint.h"
#include "tools/cli_util.h"

ABSL_FLAG(std::string, config, "", "model config JSON (original key names); empty: defaults");
ABSL_FLAG(std::string, tokenizer, "byte", "byte, char (needs --corpus) or word (needs --vocab)");
ABSL_FLAG(std::string, corpus, "", "text whose characters form the char vocabulary");
ABSL_FLAG(std::string, vocab, "", "word vocabulary file, one token per line");
ABSL_FLAG(uint64_t, seed, 1, "random seed");
ABSL_FLAG(std::string, out, "", "checkpoint to write");
ABSL_FLAG(double, init_std, 0.02, "standard deviation of the weights (0.02: the original init)");

namespace {
int Fail(int code, const std::string& msg) {
  std::cerr << "txl-init: " << msg << "\n";
  return code;
}
}  // namespace

int main(int argc, char** argv) {
  txl::ListOwnFlagsInHelp();
  absl::SetProgramUsageMessage("txl-init --config CFG.json --tokenizer byte|char|word --out M.pt");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_out).empty()) return Fail(2, "--out is required");

  txl::ModelConfig config;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    auto text = txl::ReadFile(path);
    if (!text.ok()) return Fail(1, std::string(text.status().message()));
    auto parsed = txl::ModelConfig::FromJson(*text);
    if (!parsed.ok()) return Fail(1, absl::StrCat(path, ": ", parsed.status().message()));
    config = *parsed;
  }

  std::string corpus;
  if (const std::string path = absl::GetFlag(FLAGS_corpus); !path.empty()) {
    auto text = txl::ReadFile(path);
    if (!text.ok()) return Fail(1, std::string(text.status().message()));
    corpus = *std::move(text);
  }
  auto tokenizer = txl::TokenizerFromFlags(absl::GetFlag(FLAGS_tokenizer), corpus, absl::GetFlag(FLAGS_vocab));
  if (!tokenizer.ok()) return Fail(1, std::string(tokenizer.status().message()));

  if (config.n_token == 0) {
    config.n_token = tokenizer->vocab_size();
  } else if (config.n_token != tokenizer->vocab_size()) {
    return Fail(1, absl::StrCat("config n_token=", config.n_token, " but the tokenizer has ", tokenizer->vocab_size(),
                                " symbols"));
  }
  if (auto s = config.Validate(); !s.ok()) return Fail(1, std::string(s.message()));
  if (auto s = txl::WriteInitialCheckpoint(absl::GetFlag(FLAGS_out), config, *tokenizer, absl::GetFlag(FLAGS_seed),
                                           absl::GetFlag(FLAGS_init_std));
      !s.ok()) {
    return Fail(1, std::string(s.message()));
  }
  std::cout << "wrote " << absl::GetFlag(FLAGS_out) << " (n_token=" << config.n_token << ", n_layer=" << config.n_layer
            << ", d_model=" << config.d_model << ")\n";
  return 0;
}
