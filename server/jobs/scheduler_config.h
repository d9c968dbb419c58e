// The scheduler's settings and its observer (metrics hooks); light, so that
// metrics need not include the scheduler.
#ifndef TXL_SERVER_JOBS_SCHEDULER_CONFIG_H_
#define TXL_SERVER_JOBS_SCHEDULER_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace txl {

struct SchedulerConfig {
  int max_batch = 32;           // requests per engine step
  int max_batch_tokens = 2048;  // tokens fed per engine step
  int prefill_chunk = 256;      // tokens one request feeds per step while prefilling
  int max_queue = 256;          // waiting requests; past it RESOURCE_EXHAUSTED
  // With a journal: a session's log is folded into a fresh snapshot once
  // this many tokens were logged since the last one (bounds replay time).
  int64_t snapshot_tokens = 4096;
  // A generation paused because its client stopped reading (Pause) is
  // cancelled once paused this long (StalledError).
  absl::Duration stall_timeout = absl::Seconds(30);
  // Turn checkpoints' images are copied into buffers a thread of their own
  // faulted in beforehand (ImageBuffers): this many kept ready, within a
  // quarter of --checkpoint_budget and 64 MiB. 0: none (the copy faults its
  // pages in on the engine thread).
  int checkpoint_buffers = 4;
};

// Hooks for metrics; every method is called on the engine thread.
class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;
  virtual void OnStep(int batch_size, int64_t tokens, double seconds) {}
  virtual void OnQueueDepth(int64_t depth) {}
  virtual void OnFirstToken(double seconds_since_submit) {}
  virtual void OnInterTokenGap(double seconds) {}
  virtual void OnTokensFed(int64_t n) {}
  virtual void OnTokensGenerated(int64_t n) {}
  // The same, per model version (`model`: NAME@VERSION, bounded by the
  // repository): a step of `rows` sessions feeding `tokens`, and a token generated.
  virtual void OnModelStep(const std::string& model, int rows, int64_t tokens) {}
  virtual void OnModelTokenGenerated(const std::string& model) {}
  virtual void OnSessionsExpired(int n) {}
  virtual void OnTick() {}  // about once a second
  // A session left device memory (to "host") or host memory (to "store": the state store only).
  virtual void OnOffload(const char* to, double seconds) {}
  // A session came back into device memory from "host" or "store".
  virtual void OnRestore(const char* from, double seconds) {}
  // A rewind or a fork at a position, served from a "checkpoint" (an image,
  // nothing replayed), by "replay", or from the "current" state (nothing to
  // rebuild); `replayed`: history tokens fed again.
  virtual void OnRewind(const char* served, int64_t replayed, double seconds) {}
};

}  // namespace txl

#endif  // TXL_SERVER_JOBS_SCHEDULER_CONFIG_H_
