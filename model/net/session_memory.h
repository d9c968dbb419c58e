// SessionMemory: one session's layer memories, the model's SessionState
// (model/step.h), and its byte image (what ExportSession carries).
#ifndef TXL_MODEL_NET_SESSION_MEMORY_H_
#define TXL_MODEL_NET_SESSION_MEMORY_H_

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/net/slot_pool.h"
#include "model/step.h"

namespace txl {

// One session's memory: the model's SessionState (model/step.h). Not
// thread-safe; owned by whoever owns the session.
//
// Layout: per layer, keys and values live in ring buffers [H, capacity, dh]
// where position p occupies slot p % mem_len. The capacity grows (with
// copies) until it reaches mem_len, and then stays: a decode step writes its
// new key and value in place into the slot of the position that just left the
// window, so a full session never reallocates or copies its memory. (One slot
// more than the mem_len - 1 held positions, so that a step's new key never
// overwrites a key that step still attends.)
//
// On the generic path (a GPU, --kernels generic) the slots live in the
// model's SlotPool instead: slots_[r] is the pool row of ring slot r, in
// every layer, and k_ / v_ stay undefined. A memory made elsewhere (an
// image) moves into the pool at its first step there (IncrementalModel::Adopt).
class SessionMemory final : public SessionState {
 public:
  // full_bytes: what the memory takes once its window is full (admission
  // control reserves it; LanguageModel::FullMemoryBytes). start: the
  // position its history begins at, the tokens before it unknown (bounded
  // replay, LanguageModel::NewSessionAt).
  SessionMemory(int64_t n_layer, int64_t mem_len, int64_t full_bytes = 0, int64_t start = 0)
      : mem_len_(mem_len), full_bytes_(full_bytes), position_(start), k_(n_layer), v_(n_layer) {}
  ~SessionMemory() override;  // gives pool rows back
  SessionMemory(SessionMemory&& other) noexcept;
  SessionMemory& operator=(SessionMemory&& other) noexcept;
  SessionMemory(const SessionMemory&) = delete;
  SessionMemory& operator=(const SessionMemory&) = delete;

  int64_t mem_len() const override { return mem_len_; }
  int64_t position() const override { return position_; }  // tokens in the history
  int64_t length() const { return length_; }               // positions held
  int64_t bytes() const;                                   // allocated: capacity slots in every layer
  int64_t capacity() const { return capacity_; }           // ring slots per layer
  int64_t memory_tokens() const override { return length_; }
  int64_t memory_bytes() const override { return bytes(); }
  int64_t full_memory_bytes() const override { return full_bytes_; }
  void set_full_memory_bytes(int64_t bytes) { full_bytes_ = bytes; }
  bool pooled() const { return pool_ != nullptr; }  // its slots live in a model's SlotPool
  SessionMemory Copy() const;                       // deep copy (fork); throws c10::Error when out of memory
  absl::StatusOr<std::unique_ptr<SessionState>> Clone() const override;

  // A byte image of the memory (session_memory.cc), and its inverse for a
  // model of the same shape on `device`: INVALID_ARGUMENT naming what does
  // not fit (damaged data, another model's shape). Exact: a restored session
  // continues bit for bit like the original.
  void WriteImage(std::string* out) const;  // throws c10::Error when the device copy fails
  absl::Status AppendTo(std::string* out) const override;
  // An image of either kv dtype restores into `kv_type` rings (float32 or
  // bfloat16), converted: widening is exact, narrowing rounds to nearest
  // even, as the server's own steps store a new key.
  static absl::StatusOr<SessionMemory> Parse(const std::string& data, const ModelConfig& config,
                                             const at::Device& device, at::ScalarType kv_type = at::kFloat);

 private:
  friend class IncrementalModel;
  int64_t mem_len_;
  int64_t full_bytes_;
  int64_t position_ = 0;
  int64_t length_ = 0;
  int64_t capacity_ = 0;            // < mem_len only while position_ <= capacity_ (no wrap yet)
  std::vector<at::Tensor> k_, v_;   // per layer [H, capacity, dh]; undefined while capacity is 0 or pooled
  std::shared_ptr<SlotPool> pool_;  // set while the slots live in a pool
  std::vector<int64_t> slots_;      // pooled: the pool row of each ring slot (capacity_ of them)
  void ReleaseSlots();
};

}  // namespace txl

#endif  // TXL_MODEL_NET_SESSION_MEMORY_H_
