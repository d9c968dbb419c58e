// LanguageModel: the torch-free face of model/ for the engine and the tools.
// It loads a checkpoint onto a device and advances batches of sessions with
// the incremental form (incremental.h).
//
// Threading: a LanguageModel and its sessions are driven by one thread
// at a time (the engine thread); nothing here locks.
#ifndef TXL_MODEL_NET_LANGUAGE_MODEL_H_
#define TXL_MODEL_NET_LANGUAGE_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/kernels/skinny_product.h"
#include "model/model_config.h"
#include "model/precision.h"
#include "model/step.h"
#include "model/tokenizer.h"

namespace txl {

class IncrementalModel;
class OutputLayer;
class SharedSlotPools;  // model/net/shared_slot_pools.h

// Sets libtorch's intra-op thread count for the process (threads >= 1).
void SetThreads(int threads);
// The threads one of model/'s parallel loops (the decode kernels) runs on
// now: the intra-op thread count when the build compiled them with OpenMP
// (GCC), otherwise 1 (the clang sanitizer builds: serial, same results).
int ParallelLoopThreads();
struct LanguageModelOptions {
  std::string path;                           // checkpoint file
  std::string device = "cpu";                 // "cpu", "cuda" or "cuda:N"
  int threads = 0;                            // intra-op threads; 0 keeps libtorch's default
  WeightDtype dtype = WeightDtype::kFloat32;  // the layers' product weights
  KvDtype kv_dtype = KvDtype::kFloat32;       // sessions' keys and values
  Kernels kernels = Kernels::kAuto;           // kGeneric: libtorch's ops, as on a GPU, on a CPU too
  // Decode steps as CUDA graphs, one per bucket of sessions and keys
  // (IncrementalModel::Precision::decode_graphs): kAuto on a GPU only.
  DecodeGraphs decode_graphs = DecodeGraphs::kAuto;
  // The generic path's decode attention fused and read in place
  // (IncrementalModel::Precision::split_decode_attention); false only to
  // measure the tensor ops against it.
  bool split_decode_attention = true;
  // A session feeding a few tokens feeds them a pass of one token at a time:
  // decode passes on the CPU kernels, padded graph passes on the generic path
  // with decode graphs (IncrementalModel::Precision::decode_short_feeds);
  // false only to measure the whole step through the multi-token pass.
  bool decode_short_feeds = true;
  // bfloat16 weights on the generic path: bfloat16 between the products
  // (IncrementalModel::Precision::bf16_activations); false only to measure
  // the float32 activations against it.
  bool bf16_activations = true;
  // The generic path's multi-token passes attend through one fused
  // at::scaled_dot_product_attention (IncrementalModel::Precision::
  // sdpa_pass_attention); needs libtorch 2.1 or later, refused on 1.13.
  bool sdpa_pass_attention = false;
  // A post-norm model's residual adds fused with their layer norms on the
  // generic path (IncrementalModel::Precision::fused_add_norm); false only
  // to measure the tensor ops against it.
  bool fused_add_norm = true;
  // The generic path's products of up to this many rows, 0 to
  // kSkinnyMaxRows, by our own kernel (IncrementalModel::Precision::
  // skinny_max_rows); fewer only to measure libtorch's against it.
  int64_t skinny_max_rows = kSkinnyMaxRows;
  // On the generic path, the models loaded with one SharedSlotPools share
  // their sessions' pool with the others of their shape once they join it
  // (LanguageModel::JoinSharedPool): a repository's versions of one
  // architecture hold one pool, not one each. Null: the model keeps its own.
  std::shared_ptr<SharedSlotPools> shared_pools;
};

class LanguageModel {
 public:
  static absl::StatusOr<std::unique_ptr<LanguageModel>> Create(const LanguageModelOptions& options);
  // The bytes a model of `config`, whose float32 checkpoint takes
  // `checkpoint_bytes`, holds once loaded with `options`: the layers' product
  // weights in the weight format (int8 twice: rows and panels), everything
  // else as float32, and 5% for the working buffers a load keeps. An
  // estimate from before loading it (a repository's memory budget), a few
  // percent above what a load adds (docs/CAPACITY.md, "The memory a loaded
  // version holds").
  static int64_t EstimateWeightBytes(const ModelConfig& config, const LanguageModelOptions& options,
                                     int64_t checkpoint_bytes);
  ~LanguageModel();

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const std::string& device() const { return device_name_; }
  WeightDtype dtype() const { return dtype_; }
  KvDtype kv_dtype() const { return kv_dtype_; }
  // The kernels the decode step and the prefill products run on, for the
  // start-up log line, e.g. "cpu: avx512 decode, bfloat16 weights via
  // avx512_bf16, amx_bf16 prefill".
  std::string KernelPath() const;
  // The CPU kernel family the steps use ("avx512_bf16", ...; TXL_CPU_ISA
  // caps it), for GetModelInfo; empty on a GPU and with --kernels generic.
  std::string CpuFamily() const;

  // mem_len: the session's attention window (>= 1).
  absl::StatusOr<std::unique_ptr<SessionState>> NewSession(int64_t mem_len) const;
  // An empty session whose history begins at `position` (>= 0), the tokens
  // before it unknown. Fed a history's last ReceptiveField(mem_len) tokens
  // (or more), it is the state of the whole history, up to float rounding:
  // bounded replay (docs/SESSIONS.md, "Bounded replay").
  absl::StatusOr<std::unique_ptr<SessionState>> NewSessionAt(int64_t mem_len, int64_t position) const;
  // The history tokens a state of window `mem_len` depends on:
  // n_layer x (mem_len - 1), each layer reaching mem_len - 1 further back.
  int64_t ReceptiveField(int64_t mem_len) const;
  // Bytes a session's memory takes once its window is full: keys and values
  // of mem_len ring slots in every layer (mem_len - 1 positions held, one
  // slot to write into). Admission control reserves it.
  int64_t FullMemoryBytes(int64_t mem_len) const;
  // A session from SessionState::AppendTo's bytes, on this model's device;
  // INVALID_ARGUMENT when they are damaged or fit another model's shape.
  absl::StatusOr<std::unique_ptr<SessionState>> RestoreSession(const std::string& data) const;
  // 16 hex digits identifying the weights, config and tokenizer (a hash of
  // them): sessions exported from one model import only into the same one.
  const std::string& fingerprint() const { return fingerprint_; }

  // On the generic path (a GPU), allocates the session memory pool for
  // `bytes` of sessions now, at start-up, so that no step has to grow it
  // (growing needs the old pool and the new at once). RESOURCE_EXHAUSTED
  // when the device cannot; a no-op on the CPU kernels.
  absl::Status ReserveSessionMemory(int64_t bytes);
  // Joins LanguageModelOptions::shared_pools (a no-op without it and on the
  // CPU kernels). Before the model serves, on the thread that will drive it
  // or before that thread steps it: a checked model (a warm-up step on its
  // own pool) then shares the pool of the versions already serving.
  void JoinSharedPool();

  // Advances every input's session by its tokens, in one batched forward
  // pass. Bad input (a token or target outside [0, n_token), a session
  // given twice, more targets than tokens) fails before anything runs; any
  // failure leaves every session as it was.
  absl::StatusOr<std::vector<StepOutput>> Step(absl::Span<StepInput> inputs);

 private:
  LanguageModel(ModelConfig config, Tokenizer tokenizer, std::string device_name,
                std::unique_ptr<IncrementalModel> model);

  ModelConfig config_;
  Tokenizer tokenizer_;
  std::string device_name_;
  std::string fingerprint_;
  WeightDtype dtype_ = WeightDtype::kFloat32;
  KvDtype kv_dtype_ = KvDtype::kFloat32;
  std::unique_ptr<IncrementalModel> model_;
  std::unique_ptr<OutputLayer> output_;  // reads model_'s output weights
  std::shared_ptr<SharedSlotPools> shared_pools_;
};

}  // namespace txl

#endif  // TXL_MODEL_NET_LANGUAGE_MODEL_H_
