#include "server/engine/engine.h"

namespace txl {
namespace {

class ModelSession : public EngineSession {
 public:
  ModelSession(std::unique_ptr<SessionState> state, int64_t full_bytes)
      : state_(std::move(state)), full_bytes_(full_bytes) {}
  int64_t fed() const override { return state_->position(); }
  int64_t mem_len() const override { return state_->mem_len(); }
  int64_t memory_tokens() const override { return state_->memory_tokens(); }
  int64_t memory_bytes() const override { return state_->memory_bytes(); }
  int64_t full_memory_bytes() const override { return full_bytes_; }
  absl::StatusOr<std::unique_ptr<EngineSession>> Clone() const override {
    auto copy = state_->Clone();
    if (!copy.ok()) return copy.status();
    return std::unique_ptr<EngineSession>(new ModelSession(*std::move(copy), full_bytes_));
  }
  absl::Status AppendTo(std::string* out) const override { return state_->AppendTo(out); }
  SessionState* state() { return state_.get(); }

 private:
  std::unique_ptr<SessionState> state_;
  const int64_t full_bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelEngine>> ModelEngine::Create(const LanguageModelOptions& options) {
  auto model = LanguageModel::Create(options);
  if (!model.ok()) return model.status();
  return std::unique_ptr<ModelEngine>(new ModelEngine(*std::move(model)));
}

absl::StatusOr<std::unique_ptr<EngineSession>> ModelEngine::NewSession(int64_t mem_len) {
  auto state = model_->NewSession(mem_len);
  if (!state.ok()) return state.status();
  return std::unique_ptr<EngineSession>(
      new ModelSession(*std::move(state), model_->FullMemoryBytes(mem_len)));
}

absl::StatusOr<std::unique_ptr<EngineSession>> ModelEngine::RestoreSession(const std::string& data) {
  auto state = model_->RestoreSession(data);
  if (!state.ok()) return state.status();
  const int64_t full = model_->FullMemoryBytes((*state)->mem_len());
  return std::unique_ptr<EngineSession>(new ModelSession(*std::move(state), full));
}

absl::StatusOr<std::vector<StepOutput>> ModelEngine::Step(absl::Span<EngineInput> inputs) {
  std::vector<StepInput> steps(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    // Sessions come from NewSession, so they are ModelSessions.
    steps[i].session = static_cast<ModelSession*>(inputs[i].session)->state();
    steps[i].tokens = std::move(inputs[i].tokens);
    steps[i].targets = std::move(inputs[i].targets);
    steps[i].want_last_distribution = inputs[i].want_distribution;
  }
  return model_->Step(absl::MakeSpan(steps));
}

}  // namespace txl
