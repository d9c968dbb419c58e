#include "model/net/checkpoint.h"

#include <caffe2/serialize/file_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/net/archive.h"
#include "model/net/weights.h"

namespace txl {
namespace {

constexpr char kConfigFile[] = "config.json";
constexpr char kTokenizerFile[] = "tokenizer.json";

// First line of a c10::Error, without the C++ backtrace.
std::string Brief(const c10::Error& e) {
  std::string msg = e.what_without_backtrace();
  return msg.substr(0, msg.find('\n'));
}

// Reads the checkpoint for torch::jit::load and remembers how many bytes each
// read put into each buffer. torch::jit::load takes a tensor's size from the
// pickle and its bytes from a separate record, reading the record (stored, as
// every writer stores them) straight into the buffer that becomes the tensor's
// storage, and never checks that the two agree: a truncated or crafted record
// would be read past its end by the first operation on the tensor. The last
// read into a storage's buffer is its record, so the sizes here say how much
// of each storage is real. Used by one load at a time.
class RecordingReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit RecordingReader(const std::string& path) : file_(path) {}
  size_t size() const override { return file_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* what) const override {
    const size_t got = file_.read(pos, buf, n, what);
    filled_[buf] = got;
    return got;
  }
  // Bytes the last read put at `buf`; -1 when nothing was read there.
  int64_t filled(const void* buf) const {
    auto it = filled_.find(buf);
    return it == filled_.end() ? -1 : static_cast<int64_t>(it->second);
  }

 private:
  caffe2::serialize::FileAdapter file_;
  mutable std::unordered_map<const void*, size_t> filled_;
};

// Why a loaded tensor cannot be used as it is, or "" when it can: its sizes,
// strides and offset must stay within the bytes its record really holds.
std::string StorageProblem(const at::Tensor& t, const RecordingReader& reader) {
  if (t.layout() != at::kStrided || !t.has_storage() || !t.device().is_cpu()) return "is not a dense CPU tensor";
  if (t.numel() == 0) return "";
  int64_t last = t.storage_offset();  // the element furthest into the storage
  bool overflow = last < 0;
  for (int64_t d = 0; d < t.dim() && !overflow; ++d) {
    int64_t reach;
    overflow = t.stride(d) < 0 || __builtin_mul_overflow(t.size(d) - 1, t.stride(d), &reach) ||
               __builtin_add_overflow(last, reach, &last);
  }
  int64_t needed;
  if (overflow || __builtin_add_overflow(last, 1, &needed) ||
      __builtin_mul_overflow(needed, static_cast<int64_t>(t.element_size()), &needed)) {
    return "has sizes, strides or an offset out of range";
  }
  const int64_t filled = reader.filled(t.storage().data());
  if (filled < 0) return "has data that was not read from a stored record of the archive";
  const int64_t held = std::min(filled, static_cast<int64_t>(t.storage().nbytes()));
  if (needed > held) {
    return absl::StrCat("needs ", needed, " bytes of data, but its record holds ", held, " (truncated or corrupt)");
  }
  return "";
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& path, const ModelConfig& config, const Tokenizer& tokenizer,
                            const TxlWeights& weights) {
  RETURN_IF_ERROR(config.Validate());
  if (tokenizer.vocab_size() != config.n_token) {
    return absl::InvalidArgumentError(
        absl::StrCat("config n_token=", config.n_token, " but the tokenizer has ", tokenizer.vocab_size(), " symbols"));
  }
  std::vector<ArchiveTensor> tensors;
  for (const TxlWeights::Named& n : weights.NamedTensors(config)) tensors.push_back({n.name, n.tensor, n.is_buffer});
  return WriteArchive(path, tensors, {{kConfigFile, config.ToJson()}, {kTokenizerFile, tokenizer.ToJson()}});
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
  std::shared_ptr<RecordingReader> reader;
  try {
    reader = std::make_shared<RecordingReader>(path);
    module = torch::jit::load(reader, at::Device(at::kCPU), extra);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, ": not a readable TorchScript archive: ", Brief(e)));
  } catch (const std::exception& e) {
    // The TorchScript parser reports bad code records with std::runtime_error and
    // torch::jit::ErrorReport, not c10::Error.
    std::string msg = e.what();
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, ": not a readable TorchScript archive: ", msg.substr(0, msg.find('\n'))));
  }
  const std::string source = absl::StrCat("checkpoint ", path);
  if (extra[kConfigFile].empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": has no ", kConfigFile));
  if (extra[kTokenizerFile].empty())
    return absl::InvalidArgumentError(absl::StrCat(source, ": has no ", kTokenizerFile));

  Checkpoint ckpt;
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(extra[kConfigFile]);
  if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", config.status().message()));
  if (auto s = config->Validate(); !s.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(extra[kTokenizerFile]);
  if (!tokenizer.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", tokenizer.status().message()));
  if (tokenizer->vocab_size() != config->n_token) {
    return absl::InvalidArgumentError(absl::StrCat(source,
                                                   ": config contradicts the tokenizer: n_token=", config->n_token,
                                                   " but tokenizer.json has ", tokenizer->vocab_size(), " symbols"));
  }

  std::map<std::string, at::Tensor> named;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) named[p.name] = p.value;
  for (const auto& b : module.named_buffers(/*recurse=*/true)) named[b.name] = b.value;
  for (const auto& [name, t] : named) {
    if (std::string problem = StorageProblem(t, *reader); !problem.empty())
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", name, "' ", problem));
  }
  ASSIGN_OR_RETURN(TxlWeights weights, WeightsFromNamed(*config, named, source));
  ckpt.config = *std::move(config);
  ckpt.tokenizer = *std::move(tokenizer);
  ckpt.weights = std::make_shared<TxlWeights>(std::move(weights));
  return ckpt;
}

absl::StatusOr<ModelConfig> ReadCheckpointConfig(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", path, ": no such file"));
  }
  const std::string record = absl::StrCat("extra/", kConfigFile);
  std::string json;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (!reader.hasRecord(record)) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, ": has no ", kConfigFile));
    }
    auto [data, size] = reader.getRecord(record);
    json.assign(static_cast<const char*>(data.get()), size);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, ": not a readable TorchScript archive: ", Brief(e)));
  } catch (const std::exception& e) {  // the zip reader's own errors, and allocation failures
    std::string msg = e.what();
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, ": not a readable TorchScript archive: ", msg.substr(0, msg.find('\n'))));
  }
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(json);
  if (!config.ok())
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, ": ", config.status().message()));
  if (auto s = config->Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, ": ", s.message()));
  }
  return config;
}

absl::Status WriteInitialCheckpoint(const std::string& path, const ModelConfig& config, const Tokenizer& tokenizer,
                                    uint64_t seed, double init_std) {
  RETURN_IF_ERROR(config.Validate());
  if (!(init_std > 0)) return absl::InvalidArgumentError("init_std must be > 0");
  return SaveCheckpoint(path, config, tokenizer, InitWeights(config, seed, init_std, init_std / 2));
}

}  // namespace txl
