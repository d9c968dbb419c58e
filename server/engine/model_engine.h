// ModelEngine: the Engine of a real LanguageModel on its device. The one
// server file that reaches the model; it only forwards (the types are the model's).
#ifndef TXL_SERVER_ENGINE_MODEL_ENGINE_H_
#define TXL_SERVER_ENGINE_MODEL_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "model/net/language_model.h"
#include "model/precision.h"
#include "server/engine/engine.h"

namespace txl {

class ModelEngine : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<ModelEngine>> Create(const LanguageModelOptions& options);

  int64_t vocab_size() const override { return model_->config().n_token; }
  absl::StatusOr<std::unique_ptr<SessionState>> NewSession(int64_t mem_len) override {
    return model_->NewSession(mem_len);
  }
  absl::StatusOr<std::unique_ptr<SessionState>> NewSessionAt(int64_t mem_len, int64_t position) override {
    return model_->NewSessionAt(mem_len, position);
  }
  int64_t ReceptiveField(int64_t mem_len) const override { return model_->ReceptiveField(mem_len); }
  int64_t FullMemoryBytes(int64_t mem_len) const override { return model_->FullMemoryBytes(mem_len); }
  absl::StatusOr<std::unique_ptr<SessionState>> RestoreSession(const std::string& data) override {
    return model_->RestoreSession(data);
  }
  std::string fingerprint() const override { return model_->fingerprint(); }
  std::string numerics() const override { return DtypeName(model_->dtype()) + "/" + DtypeName(model_->kv_dtype()); }
  absl::StatusOr<std::vector<StepOutput>> Step(absl::Span<StepInput> inputs) override { return model_->Step(inputs); }

  const LanguageModel& model() const { return *model_; }
  // Start-up only, before the engine thread runs (LanguageModel::ReserveSessionMemory).
  absl::Status ReserveSessionMemory(int64_t bytes) { return model_->ReserveSessionMemory(bytes); }
  // Before the engine thread steps it (LanguageModel::JoinSharedPool).
  void JoinSharedPool() { model_->JoinSharedPool(); }

 private:
  explicit ModelEngine(std::unique_ptr<LanguageModel> model) : model_(std::move(model)) {}
  std::unique_ptr<LanguageModel> model_;
};

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_MODEL_ENGINE_H_
