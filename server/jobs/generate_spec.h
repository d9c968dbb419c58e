// GenerateSpec: one generation as request validation hands it to the
// scheduler (the validated request; nothing of the session). Light on
// purpose: request validation includes it, not the scheduler.
#ifndef TXL_SERVER_JOBS_GENERATE_SPEC_H_
#define TXL_SERVER_JOBS_GENERATE_SPEC_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/sampling/grammar.h"
#include "server/sampling/sampler.h"
#include "server/sampling/token_masker.h"

namespace txl {

struct GenerateSpec {
  std::vector<int> input;   // new tokens only
  int max_new_tokens = 16;  // 0 only with echo: the input's log-probs alone
  SamplingConfig sampling;
  std::vector<int> stop_token_ids;
  std::vector<std::string> stop_sequences;
  int top_logprobs = 0;
  // The input's log-probs too (GeneratedTokenEvent::echo): the whole input
  // is fed, never a cached or bounded start.
  bool echo = false;
  // A choice of a call with several (ServiceCore::Generate's n): when the
  // call began, which its time to the first token counts from (its job
  // starts once the prompt is fed). InfinitePast: the job's submission.
  absl::Time call_start = absl::InfinitePast();
  // Constrained output: what the generated text must follow (null: nothing).
  std::shared_ptr<const Grammar> grammar;
  // Its masks for the model's vocabulary, shared by the generations that
  // follow the same grammar (GrammarCache); null: the job makes its own.
  std::shared_ptr<TokenMasker> masker;
};

}  // namespace txl

#endif  // TXL_SERVER_JOBS_GENERATE_SPEC_H_
