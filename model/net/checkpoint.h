// The checkpoint file (docs/FORMATS.md, "Checkpoint"): one TorchScript archive whose
// module tree carries the weights under the original names, with the model
// config (config.json) and tokenizer (tokenizer.json) as extra files.
// Torch-free header: TxlWeights is only named here.
#ifndef TXL_MODEL_NET_CHECKPOINT_H_
#define TXL_MODEL_NET_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/tokenizer.h"

namespace txl {

struct TxlWeights;

struct Checkpoint {
  ModelConfig config;
  Tokenizer tokenizer = Tokenizer::Byte();
  std::shared_ptr<TxlWeights> weights;  // on the CPU, float32
};

// Writes atomically (temporary file in the same directory, then rename).
absl::Status SaveCheckpoint(const std::string& path, const ModelConfig& config, const Tokenizer& tokenizer,
                            const TxlWeights& weights);

// Every failure names the file, and the tensor or key at fault: a missing
// file, a file that is not a TorchScript zip, missing config.json or
// tokenizer.json, a bad config, a missing tensor, a wrong shape, a config
// that contradicts the tensors or the tokenizer, non-finite weights.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& path);

// The config alone, read from the archive's config.json without loading a
// tensor (sizing a version before loading it). Errors as LoadCheckpoint's.
absl::StatusOr<ModelConfig> ReadCheckpointConfig(const std::string& path);

// A freshly initialised model: normal(0, init_std) as the original init
// (0.02); tests use larger values so that the distributions are peaked.
absl::Status WriteInitialCheckpoint(const std::string& path, const ModelConfig& config, const Tokenizer& tokenizer,
                                    uint64_t seed, double init_std = 0.02);

}  // namespace txl

#endif  // TXL_MODEL_NET_CHECKPOINT_H_
