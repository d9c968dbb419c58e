// Engine: the narrow interface between the scheduler and the model. The
// scheduler's tests drive it with a fake; ModelEngine runs the real
// LanguageModel. Step and EngineSession::Clone run on the one engine thread;
// NewSession allocates no tensors and may be called from any thread.
#ifndef TXL_SERVER_ENGINE_ENGINE_H_
#define TXL_SERVER_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/language_model.h"

namespace txl {

// A session's model state (its layer memories).
class EngineSession {
 public:
  virtual ~EngineSession() = default;
  virtual int64_t fed() const = 0;            // tokens in the memory's history
  virtual int64_t mem_len() const = 0;
  virtual int64_t memory_tokens() const = 0;
  virtual int64_t memory_bytes() const = 0;
  virtual int64_t full_memory_bytes() const = 0;  // memory_bytes once the window is full
  virtual absl::StatusOr<std::unique_ptr<EngineSession>> Clone() const = 0;
  // An exact byte image of the state (Engine::RestoreSession reads it).
  virtual absl::Status AppendTo(std::string* out) const = 0;
};

struct EngineInput {
  EngineSession* session = nullptr;
  std::vector<int> tokens;
  std::vector<int> targets;  // targets[i] scored after tokens[i]
  bool want_distribution = false;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual int64_t vocab_size() const = 0;
  virtual absl::StatusOr<std::unique_ptr<EngineSession>> NewSession(int64_t mem_len) = 0;
  // A session from EngineSession::AppendTo's bytes; INVALID_ARGUMENT when
  // they are damaged or fit another model. Engine thread only.
  virtual absl::StatusOr<std::unique_ptr<EngineSession>> RestoreSession(const std::string& data) = 0;
  // Identifies the model: exported sessions import only where it matches.
  virtual std::string fingerprint() const = 0;
  // One batched forward pass; consumes the inputs' token vectors. On error
  // no session has changed.
  virtual absl::StatusOr<std::vector<StepOutput>> Step(absl::Span<EngineInput> inputs) = 0;
};

// The real engine: a LanguageModel on its device.
class ModelEngine : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<ModelEngine>> Create(const LanguageModelOptions& options);

  int64_t vocab_size() const override { return model_->config().n_token; }
  absl::StatusOr<std::unique_ptr<EngineSession>> NewSession(int64_t mem_len) override;
  absl::StatusOr<std::unique_ptr<EngineSession>> RestoreSession(const std::string& data) override;
  std::string fingerprint() const override { return model_->fingerprint(); }
  absl::StatusOr<std::vector<StepOutput>> Step(absl::Span<EngineInput> inputs) override;

  const LanguageModel& model() const { return *model_; }

 private:
  explicit ModelEngine(std::unique_ptr<LanguageModel> model) : model_(std::move(model)) {}
  std::unique_ptr<LanguageModel> model_;
};

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_ENGINE_H_
