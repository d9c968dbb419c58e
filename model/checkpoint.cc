#include "model/checkpoint.h"

#include <torch/script.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "model/archive.h"
#include "model/weights.h"

namespace txl {
namespace {

constexpr char kConfigFile[] = "config.json";
constexpr char kTokenizerFile[] = "tokenizer.json";

// First line of a c10::Error, without the C++ backtrace.
std::string Brief(const c10::Error& e) {
  std::string msg = e.what_without_backtrace();
  return msg.substr(0, msg.find('\n'));
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& path, const ModelConfig& config,
                            const Tokenizer& tokenizer, const TxlWeights& weights) {
  if (auto s = config.Validate(); !s.ok()) return s;
  if (tokenizer.vocab_size() != config.n_token) {
    return absl::InvalidArgumentError(absl::StrCat("config n_token=", config.n_token,
                                                   " but the tokenizer has ",
                                                   tokenizer.vocab_size(), " symbols"));
  }
  std::vector<ArchiveTensor> tensors;
  for (const TxlWeights::Named& n : weights.NamedTensors(config))
    tensors.push_back({n.name, n.tensor, n.is_buffer});
  return WriteArchive(path, tensors,
                      {{kConfigFile, config.ToJson()}, {kTokenizerFile, tokenizer.ToJson()}});
}

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", path, ": no such file"));
  }
  {
    std::ifstream in(path, std::ios::binary);
    char magic[4] = {0, 0, 0, 0};
    in.read(magic, 4);
    if (!in || magic[0] != 'P' || magic[1] != 'K' || magic[2] != 3 || magic[3] != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", path, ": not a TorchScript archive (not a zip file)"));
    }
  }
  torch::jit::ExtraFilesMap extra = {{kConfigFile, ""}, {kTokenizerFile, ""}};
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, at::Device(at::kCPU), extra);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, ": not a readable TorchScript archive: ", Brief(e)));
  }
  const std::string source = absl::StrCat("checkpoint ", path);
  if (extra[kConfigFile].empty())
    return absl::InvalidArgumentError(absl::StrCat(source, ": has no ", kConfigFile));
  if (extra[kTokenizerFile].empty())
    return absl::InvalidArgumentError(absl::StrCat(source, ": has no ", kTokenizerFile));

  Checkpoint ckpt;
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(extra[kConfigFile]);
  if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", config.status().message()));
  if (auto s = config->Validate(); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(extra[kTokenizerFile]);
  if (!tokenizer.ok())
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", tokenizer.status().message()));
  if (tokenizer->vocab_size() != config->n_token) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": config contradicts the tokenizer: n_token=", config->n_token,
        " but tokenizer.json has ", tokenizer->vocab_size(), " symbols"));
  }

  std::map<std::string, at::Tensor> named;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) named[p.name] = p.value;
  for (const auto& b : module.named_buffers(/*recurse=*/true)) named[b.name] = b.value;
  absl::StatusOr<TxlWeights> weights = WeightsFromNamed(*config, named, source);
  if (!weights.ok()) return weights.status();
  ckpt.config = *std::move(config);
  ckpt.tokenizer = *std::move(tokenizer);
  ckpt.weights = std::make_shared<TxlWeights>(*std::move(weights));
  return ckpt;
}

absl::Status WriteInitialCheckpoint(const std::string& path, const ModelConfig& config,
                                    const Tokenizer& tokenizer, uint64_t seed, double init_std) {
  if (auto s = config.Validate(); !s.ok()) return s;
  if (!(init_std > 0)) return absl::InvalidArgumentError("init_std must be > 0");
  return SaveCheckpoint(path, config, tokenizer, InitWeights(config, seed, init_std, init_std / 2));
}

}  // namespace txl
