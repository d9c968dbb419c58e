// ModelSource: the model versions a server serves, as requests and journal
// records name them. One model (SingleModel: the --model file) or a
// repository's ready versions (RepositoryModels). Torch-free.
//
// A request names a model as NAME (its newest ready version) or NAME@VERSION
// (that version, pinned); ParseModelRef reads the form.
//
// Threading: thread-safe (a repository's source asks the repository).
#ifndef TXL_SERVER_ENGINE_MODEL_SOURCE_H_
#define TXL_SERVER_ENGINE_MODEL_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/model_repository.h"
#include "server/engine/served_model.h"

namespace txl {

struct ModelRef {
  std::string name;     // empty: the server's only model
  int64_t version = 0;  // 0: the newest ready version
};
// "", "NAME" or "NAME@VERSION"; INVALID_ARGUMENT naming the text and the forms.
absl::StatusOr<ModelRef> ParseModelRef(absl::string_view text);

class ModelSource {
 public:
  virtual ~ModelSource() = default;
  // The version `ref` names. An empty name is the server's only model
  // (INVALID_ARGUMENT listing them when it serves several); NOT_FOUND names
  // a model or version not served (and, for a version, its state).
  virtual absl::StatusOr<std::shared_ptr<ServedModel>> Find(const ModelRef& ref) const = 0;
  // The ready versions, by name, then version.
  virtual std::vector<std::shared_ptr<ServedModel>> Ready() const = 0;
  // The versions loaded: the ready ones and the retiring ones sessions
  // still hold (a session adopted from another replica may be on one).
  virtual std::vector<std::shared_ptr<ServedModel>> Loaded() const { return Ready(); }
  // Every version seen and its state (ModelRepository::List; one READY
  // version for SingleModel).
  virtual std::vector<VersionStatus> List() const = 0;
  // The loaded version whose engine has `fingerprint` (a journal record's);
  // FAILED_PRECONDITION naming it and what is served when none has.
  absl::StatusOr<std::shared_ptr<ServedModel>> WithFingerprint(const std::string& fingerprint) const;
  // "NAME@VERSION FINGERPRINT, ..." of the ready versions ("none").
  std::string DescribeReady() const;
};

// The one version `model` of a server started with --model.
std::unique_ptr<ModelSource> SingleModel(std::shared_ptr<ServedModel> model);
// The ready versions of `repository` (which must outlive the source), whose
// loader makes ServedModels.
std::unique_ptr<ModelSource> RepositoryModels(const ModelRepository* repository);

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_MODEL_SOURCE_H_
