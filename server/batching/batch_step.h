// One batched engine step (continuous batching, docs/DESIGN.md, "The
// scheduler: one engine thread, continuous batching"): up to max_batch rows
// under max_batch_tokens, decoders first (taking turns when there are more
// than max_batch of them), then prefill chunks of up to prefill_chunk tokens
// in arrival order, so a long prefill cannot starve a decoder. Each row's
// output goes back to its job (FeedJob::TakeOutput). A step runs the
// sessions of one model version (one engine); versions with work take turns,
// a step each.
#ifndef TXL_SERVER_BATCHING_BATCH_STEP_H_
#define TXL_SERVER_BATCHING_BATCH_STEP_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "server/jobs/job.h"
#include "server/jobs/job_runner.h"

namespace txl {

class BatchStep {
 public:
  explicit BatchStep(JobRunner* runner) : runner_(runner) {}
  // Engine thread. Finished jobs get no row, nor do paused decoders.
  void Run(const std::vector<std::shared_ptr<Job>>& active);

 private:
  JobRunner* const runner_;
  size_t rotate_ = 0;              // where the decoders' turn starts when they exceed max_batch
  Engine* last_engine_ = nullptr;  // the engine the last step ran
};

}  // namespace txl

#endif  // TXL_SERVER_BATCHING_BATCH_STEP_H_
