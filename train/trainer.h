// Trainer: trains a MemTransformerLM the Transformer-XL way (parallel
// streams, consecutive segments carrying memories without gradient), data
// parallel across processes, evaluating with the serving semantics.
// Threading: single-threaded; collective calls happen in lockstep per rank.
#ifndef TXL_TRAIN_TRAINER_H_
#define TXL_TRAIN_TRAINER_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "train/lm_data.h"

namespace txl {

class DataParallel;
struct TxlWeights;

// Errors about these options name the field ("resume: no training state at ..."), never a
// command-line flag: the mains decide how a field is spelt on their command line.
struct TrainOptions {
  int64_t tgt_len = 128;
  int64_t mem_len = 128;     // training memory (the config's mem_len is the serving default)
  bool same_length = false;  // training mask; false is the original default
  int64_t batch_size = 16;   // streams per process
  double lr = 2.5e-4;
  int64_t warmup_steps = 0;  // linear warm-up, then cosine decay to min_lr at max_steps
  double min_lr = 0.0;
  int64_t max_steps = 1000;
  double time_budget_s = 0;    // > 0: also stop when this much wall time has passed
  int64_t steps_this_run = 0;  // > 0: stop after this many steps (the schedule still ends at max_steps)
  double clip = 0.25;          // gradient norm clip; <= 0 disables
  uint64_t seed = 1;
  int64_t log_interval = 50;
  int64_t eval_interval = 500;        // 0: only at the end
  int64_t checkpoint_interval = 500;  // 0: only at the end
  int64_t eval_mem_len = 256;
  int64_t eval_tgt_len = 128;
  int64_t eval_streams = 8;
  int64_t eval_max_tokens = 0;  // 0: the whole valid split
  std::string out;              // checkpoint path; training state goes beside it
  bool resume = false;
  std::string loss_log;       // optional: "step loss" per line, every step (rank 0)
  bool progress_bar = false;  // redraw a one-line bar every step (for a terminal)
  // Where the model, its gradients, the optimizer state and the memories
  // live: "cpu", "cuda" (cuda:LOCAL_RANK in a data-parallel run) or "cuda:N".
  // Checkpoints and training state are written as CPU tensors either way.
  std::string device = "cpu";
};

struct EvalResult {
  double loss = 0;  // nats per token
  double bpc = 0;
  double ppl = 0;
  int64_t tokens = 0;
};

struct TrainReport {
  int64_t steps = 0;
  double last_loss = 0;
  double tokens_per_second = 0;
  double seconds = 0;
  EvalResult eval_mem, eval_no_mem;
};

// Log-likelihood of `data` in segments of tgt_len with same_length memories
// of mem_len (0: no memory, causal within each segment). Runs on the device
// the weights are on.
EvalResult Evaluate(const ModelConfig& config, const TxlWeights& weights, const std::vector<int>& data, int64_t mem_len,
                    int64_t tgt_len, int64_t streams, int64_t max_tokens);

class Trainer {
 public:
  // `config` holds the model hyperparameters (n_token must match the
  // tokenizer). `parallel` may be null for a single process; otherwise it
  // must have been set up for options.device (DataParallel::FromEnvironment).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainOptions& options, const ModelConfig& config,
                                                         const Tokenizer& tokenizer, CorpusSplit data,
                                                         DataParallel* parallel);
  ~Trainer();

  // Logs progress to `log` (rank 0 only) and writes checkpoints.
  absl::StatusOr<TrainReport> Run(std::ostream& log);

 private:
  struct State;
  explicit Trainer(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace txl

#endif  // TXL_TRAIN_TRAINER_H_
