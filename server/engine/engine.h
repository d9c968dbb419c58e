// Engine: the narrow interface between the scheduler and the model, in the
// model's own step types (model/step.h). The scheduler's tests drive it with
// a fake; ModelEngine (model_engine.h) runs the real LanguageModel.
// Step, RestoreSession and SessionState::Clone run on the one engine thread;
// NewSession allocates no tensors and may be called from any thread.
#ifndef TXL_SERVER_ENGINE_ENGINE_H_
#define TXL_SERVER_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/step.h"

namespace txl {

class Engine {
 public:
  virtual ~Engine() = default;
  virtual int64_t vocab_size() const = 0;
  virtual absl::StatusOr<std::unique_ptr<SessionState>> NewSession(int64_t mem_len) = 0;
  // An empty session whose history begins at `position`: fed the last
  // ReceptiveField(mem_len) tokens of a history, it is that history's state
  // (LanguageModel::NewSessionAt).
  virtual absl::StatusOr<std::unique_ptr<SessionState>> NewSessionAt(int64_t mem_len, int64_t position) = 0;
  // How many of its last history tokens a state of window `mem_len` depends on.
  virtual int64_t ReceptiveField(int64_t mem_len) const = 0;
  // The bytes a session of window `mem_len` holds when full: what admission
  // counts (SessionState::full_memory_bytes).
  virtual int64_t FullMemoryBytes(int64_t mem_len) const = 0;
  // A session from SessionState::AppendTo's bytes; INVALID_ARGUMENT when
  // they are damaged or fit another model. Engine thread only.
  virtual absl::StatusOr<std::unique_ptr<SessionState>> RestoreSession(const std::string& data) = 0;
  // Identifies the model: exported sessions import only where it matches.
  virtual std::string fingerprint() const = 0;
  // The number formats its states are computed in (weights, memories): two
  // engines whose fingerprint and numerics agree compute the same states.
  virtual std::string numerics() const = 0;
  // One batched forward pass over sessions this engine made. On error no
  // session has changed.
  virtual absl::StatusOr<std::vector<StepOutput>> Step(absl::Span<StepInput> inputs) = 0;
};

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_ENGINE_H_
