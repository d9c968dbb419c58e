#include "server/engine/model_engine.h"

#include "base/status_macros.h"

namespace txl {

absl::StatusOr<std::unique_ptr<ModelEngine>> ModelEngine::Create(const LanguageModelOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<LanguageModel> model, LanguageModel::Create(options));
  return std::unique_ptr<ModelEngine>(new ModelEngine(std::move(model)));
}

}  // namespace txl
