// Loading a repository's versions as ServedModels: ModelRepository's
// VersionLoader and VersionSizer for real checkpoints, every version in the
// device and number formats of one LanguageModelOptions (its path aside).
#ifndef TXL_SERVER_ENGINE_MODEL_LOADER_H_
#define TXL_SERVER_ENGINE_MODEL_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/model_repository_layout.h"
#include "model/net/language_model.h"
#include "server/engine/model_limits.h"
#include "server/engine/model_repository.h"
#include "server/engine/served_model.h"

namespace txl {

// Loads `v` and checks it before anyone may use it: the checkpoint's config
// against its tensors and tokenizer (LanguageModel::Create), its fingerprint,
// and a warm-up step whose log-probs must be finite and sum to one. The
// model's limits.json (beside its versions: DIR/NAME/limits.json) is read
// and checked against `ceilings`, the server's flags (model_limits.h). The
// error names the file and the check that failed.
absl::StatusOr<std::unique_ptr<ServedModel>> LoadServedModel(const LanguageModelOptions& options,
                                                             const std::string& name, const RepositoryVersion& v,
                                                             const ModelLimits& ceilings = {});

// What `v` will hold once loaded with `options`, from its file alone (its
// size and config.json; no tensor is read): LanguageModel::EstimateWeightBytes.
absl::StatusOr<int64_t> EstimateServedBytes(const LanguageModelOptions& options, const RepositoryVersion& v);

VersionLoader ServedModelLoader(LanguageModelOptions options, ModelLimits ceilings = {});
VersionSizer ServedModelSizer(LanguageModelOptions options);

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_MODEL_LOADER_H_
