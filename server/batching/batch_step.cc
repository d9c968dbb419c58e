#include "server/batching/batch_step.h"

#include <algorithm>
#include <functional>

namespace txl {

void BatchStep::Run(const std::vector<std::shared_ptr<Job>>& active) {
  const SchedulerConfig& config = runner_->config();
  std::vector<FeedJob*> rows;
  std::vector<StepInput> inputs;
  std::vector<size_t> counts;  // tokens each row feeds
  int64_t budget = config.max_batch_tokens;
  auto add = [&](FeedJob* job, size_t n) {
    rows.push_back(job);
    inputs.push_back(job->Row(n));
    counts.push_back(n);
    budget -= static_cast<int64_t>(n);
  };
  // One step runs one engine (one model version): the engines with a row to
  // run take turns, in the order of their addresses after the last one stepped.
  std::vector<Engine*> engines;
  for (const auto& job : active) {
    FeedJob* feed = job->done ? nullptr : job->feeding();
    if (feed == nullptr) continue;
    const bool has_row = feed->decoding() ? feed->paused_since.load() == 0 : feed->prefill_left() > 0;
    if (has_row) engines.push_back(&JobRunner::EngineOf(feed->lease));
  }
  if (engines.empty()) return;
  std::sort(engines.begin(), engines.end(), std::less<Engine*>());
  auto next = std::upper_bound(engines.begin(), engines.end(), last_engine_, std::less<Engine*>());
  Engine* const engine = next == engines.end() ? engines.front() : *next;
  last_engine_ = engine;
  // Resumed jobs may make more decoders than max_batch for a while: they
  // take turns (the start rotates), so none waits for the others to end.
  std::vector<FeedJob*> decoders, feeders;  // feeders: every feeding kind still running, in arrival order
  for (const auto& job : active) {
    FeedJob* feed = job->done ? nullptr : job->feeding();
    if (feed == nullptr || &JobRunner::EngineOf(feed->lease) != engine) continue;
    feeders.push_back(feed);
    if (feed->decoding() && feed->paused_since.load() == 0) decoders.push_back(feed);
  }
  const size_t max_batch = static_cast<size_t>(config.max_batch);
  const size_t first = decoders.size() > max_batch ? rotate_++ % decoders.size() : 0;
  for (size_t k = 0; k < decoders.size() && rows.size() < max_batch; ++k)
    add(decoders[(first + k) % decoders.size()], 1);
  for (FeedJob* job : feeders) {
    if (rows.size() >= max_batch) break;
    if (job->decoding()) continue;
    const size_t left = job->prefill_left();
    if (left == 0) continue;
    int64_t n = std::min<int64_t>({static_cast<int64_t>(left), config.prefill_chunk, budget});
    if (n <= 0) {
      if (!rows.empty()) break;
      n = std::min<int64_t>(static_cast<int64_t>(left), config.prefill_chunk);  // always progress
    }
    add(job, static_cast<size_t>(n));
  }
  if (rows.empty()) return;

  int64_t total_tokens = 0;
  for (size_t n : counts) total_tokens += static_cast<int64_t>(n);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<StepOutput>> out = engine->Step(absl::MakeSpan(inputs));
  if (SchedulerObserver* o = runner_->observer()) {
    o->OnStep(static_cast<int>(rows.size()), total_tokens, SecondsSince(start));
    o->OnTokensFed(total_tokens);
    if (const auto& model = rows.front()->lease.model) {
      o->OnModelStep(model->ref(), static_cast<int>(rows.size()), total_tokens);
    }
  }
  if (!out.ok()) {
    // Out of device memory, or of the session pools' budget: RESOURCE_EXHAUSTED,
    // as admission would have said. Anything else is the server's fault.
    const absl::StatusCode code =
        absl::IsResourceExhausted(out.status()) ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal;
    for (FeedJob* job : rows) runner_->Finish(*job, absl::Status(code, out.status().message()));
    return;
  }
  for (size_t r = 0; r < rows.size(); ++r) rows[r]->TakeOutput(*runner_, (*out)[r], counts[r]);
}

}  // namespace txl
