// GenerateJob: prefills the session with its pending token and the input,
// then samples one token a step and feeds it back, until a stop token, a
// stop sequence, max_new_tokens or a cancel. Each token goes out as it is
// sampled (once journaled, for a journaled session); the last one stays
// pending in the session. With echo it also scores the input as it feeds it;
// generating nothing (max_new_tokens 0, echo only) it feeds all but the last
// input token, which stays pending.
#ifndef TXL_SERVER_JOBS_GENERATE_JOB_H_
#define TXL_SERVER_JOBS_GENERATE_JOB_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/jobs/generate_spec.h"
#include "server/jobs/job.h"
#include "server/sampling/grammar.h"
#include "server/sampling/sampler.h"
#include "server/sampling/text_stream.h"
#include "server/sampling/token_masker.h"

namespace txl {

class GenerateJob final : public FeedJob {
 public:
  GenerateJob(SessionLease lease, GenerateSpec spec, GenerateCallbacks callbacks);

  void Run(JobRunner& runner) override;
  Answer TakeAnswer() override;
  bool decoding() const override { return decoding_; }
  size_t prefill_left() const override;
  StepInput Row(size_t n) override;
  void TakeOutput(JobRunner& runner, StepOutput& out, size_t n) override;
  void Settle(const absl::Status& status) override;
  bool logs_history() const override { return true; }

 private:
  GenerateSpec spec_;
  const absl::Time started_;  // what the time to its first token counts from
  GenerateCallbacks callbacks_;
  // How it ended: set when a step ends it, else by Settle (a cancel, a
  // stall, or an error before the end).
  std::optional<Finish> finish_;
  int64_t generated_tokens_ = 0;
  std::string trailing_text_;
  Sampler sampler_;
  TextStream text_;
  bool decoding_ = false;  // prefill done; feeding back sampled tokens
  int last_ = -1;          // the last sampled token (unfed)
  absl::Time last_token_at_;
  std::vector<ScoredTokenResult> echo_;  // the input's, until the first token (or the end) takes them
  std::optional<GrammarState> grammar_;  // constrained output: where the text so far is in its grammar
  std::shared_ptr<TokenMasker> masker_;  // the spec's, or one of its own
  bool after_word_ = false;              // word level: the text so far ends in a word (the next is spaced)
  // The tokens that can continue the text: the first token's taken by Row,
  // each next one's by TakeOutput with the token before it, so a dead end
  // ends the call before a step feeds that token.
  std::shared_ptr<const TokenMask> mask_;
  absl::Status dead_end_;  // Row found no token that can begin the text
  // The tokens the grammar allows for the next token (Row: mask_, or null
  // when no token of the vocabulary can continue the text).
  absl::StatusOr<std::shared_ptr<const TokenMask>> NextMask();
};

}  // namespace txl

#endif  // TXL_SERVER_JOBS_GENERATE_JOB_H_
