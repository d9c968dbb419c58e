#include "server/engine/model_source.h"

#include <utility>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/model_repository_layout.h"
#include "base/status_macros.h"

namespace txl {

namespace {

std::string Names(const std::vector<std::shared_ptr<ServedModel>>& ready) {
  std::vector<std::string> names;
  for (const auto& m : ready) {
    if (names.empty() || names.back() != m->ref()) names.push_back(m->ref());
  }
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

class Single final : public ModelSource {
 public:
  explicit Single(std::shared_ptr<ServedModel> model) : model_(std::move(model)) {}
  absl::StatusOr<std::shared_ptr<ServedModel>> Find(const ModelRef& ref) const override {
    if (!ref.name.empty() && ref.name != model_->name()) {
      return absl::NotFoundError(absl::StrCat("model \"", ref.name, "\" is not served (served: ", model_->name(), ")"));
    }
    if (ref.version != 0 && ref.version != model_->version()) {
      return absl::NotFoundError(absl::StrCat("model \"", model_->name(), "\" has no version ", ref.version,
                                              " (served: ", Names(Ready()), ")"));
    }
    return model_;
  }
  std::vector<std::shared_ptr<ServedModel>> Ready() const override { return {model_}; }
  std::vector<VersionStatus> List() const override {
    return {VersionStatus{model_->name(), model_->version(), VersionState::kReady, "", model_->path()}};
  }

 private:
  const std::shared_ptr<ServedModel> model_;
};

class FromRepository final : public ModelSource {
 public:
  explicit FromRepository(const ModelRepository* repository) : repository_(repository) {}
  absl::StatusOr<std::shared_ptr<ServedModel>> Find(const ModelRef& ref) const override {
    std::string name = ref.name;
    if (name.empty()) {
      std::vector<std::shared_ptr<ServedModel>> ready = Ready();
      for (const auto& m : ready) {
        if (m->name() != ready.front()->name()) {
          return absl::InvalidArgumentError(
              absl::StrCat("model: required, this server serves several (", Names(ready), ")"));
        }
      }
      if (ready.empty()) return absl::NotFoundError("no model is ready");
      name = ready.front()->name();
    }
    ASSIGN_OR_RETURN(ModelRepository::Found found, repository_->Find(name, ref.version));
    return std::static_pointer_cast<ServedModel>(found.served);
  }
  std::vector<std::shared_ptr<ServedModel>> Ready() const override {
    std::vector<std::shared_ptr<ServedModel>> out;
    for (auto& v : repository_->Ready()) out.push_back(std::static_pointer_cast<ServedModel>(std::move(v)));
    return out;
  }
  std::vector<VersionStatus> List() const override { return repository_->List(); }
  std::vector<std::shared_ptr<ServedModel>> Loaded() const override {
    std::vector<std::shared_ptr<ServedModel>> out;
    for (auto& v : repository_->Loaded()) out.push_back(std::static_pointer_cast<ServedModel>(std::move(v)));
    return out;
  }

 private:
  const ModelRepository* const repository_;
};

}  // namespace

absl::StatusOr<ModelRef> ParseModelRef(absl::string_view text) {
  ModelRef ref;
  const size_t at = text.find('@');
  ref.name = std::string(text.substr(0, at));
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("model: \"", text,
                                                   "\" is not a model name (NAME, or NAME@VERSION with VERSION a "
                                                   "positive integer; a name is ",
                                                   kModelNameRule, ")"));
  };
  if (text.empty()) return ref;
  if (!IsModelName(ref.name)) return bad();
  if (at != absl::string_view::npos) {
    const absl::string_view v = text.substr(at + 1);
    if (v.empty() || v.size() > 18 || v[0] == '0' || !absl::c_all_of(v, absl::ascii_isdigit)) return bad();
    if (!absl::SimpleAtoi(v, &ref.version)) return bad();
  }
  return ref;
}

absl::StatusOr<std::shared_ptr<ServedModel>> ModelSource::WithFingerprint(const std::string& fingerprint) const {
  for (const auto& m : Loaded()) {
    if (m->engine()->fingerprint() == fingerprint) return m;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("model ", fingerprint, " is not served here (serving ", DescribeReady(), ")"));
}

std::string ModelSource::DescribeReady() const {
  std::vector<std::string> served;
  for (const auto& m : Ready()) served.push_back(absl::StrCat(m->ref(), " ", m->engine()->fingerprint()));
  return served.empty() ? "none" : absl::StrJoin(served, ", ");
}

std::unique_ptr<ModelSource> SingleModel(std::shared_ptr<ServedModel> model) {
  return std::make_unique<Single>(std::move(model));
}

std::unique_ptr<ModelSource> RepositoryModels(const ModelRepository* repository) {
  return std::make_unique<FromRepository>(repository);
}

}  // namespace txl
