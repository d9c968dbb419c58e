// ChoiceSet: the choices of one generation with n > 1 or best_of > 1, as one
// call to the transport (ServiceCore::Generate). Each choice is a GenerateJob
// on its own copy of the prompt's session (BranchJob). Its tokens go to the
// transport as they come, marked with the choice's index; with best_of above
// n they are held until every candidate has ended, and only the n with the
// highest total log-prob go out, numbered 0..n-1 from the best. The
// transport's on_done runs once, after the last choice: each kept choice's
// end, and the call's usage (the prompt once, every candidate's tokens).
// Without best_of, a choice that ends before the last goes to the
// transport's on_choice_end as it ends, when the transport has one.
//
// Threading: thread-safe; the transport's callbacks run outside the lock,
// in order (the choices' jobs all run on the engine thread).
#ifndef TXL_SERVER_CORE_CHOICES_H_
#define TXL_SERVER_CORE_CHOICES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/jobs/job_results.h"

namespace txl {

class ChoiceSet : public std::enable_shared_from_this<ChoiceSet> {
 public:
  // `n` choices kept of `best_of` drawn; `on_error` runs (outside the lock)
  // when a choice fails, so that the call can cancel the others.
  ChoiceSet(int n, int best_of, GenerateCallbacks transport, std::function<void()> on_error);

  // The prompt is fed (its tokens, and the times of its feed).
  void Branched(int64_t input_tokens, const JobTimes& times);
  // Candidate `index`'s callbacks, for its GenerateJob.
  GenerateCallbacks For(int index);
  // The call failed before its choices started (a refusal, or the prompt's
  // feed failed): on_done gets `status`.
  void Fail(absl::Status status);

 private:
  struct Candidate {
    std::vector<std::pair<std::vector<GeneratedTokenEvent>, int64_t>> held;  // best_of > n: until the end
    double logprob = 0;                                                      // its tokens' total
    bool ended = false;
    ChoiceEnd end;
  };
  using Actions = std::vector<std::function<void()>>;
  void Tokens(int index, std::vector<GeneratedTokenEvent> events, int64_t position);
  void Ended(int index, absl::Status status, GenerateResult result);
  // Once every candidate has ended: the kept ones' held tokens, then on_done.
  void Finish(Actions& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int n_, best_of_;
  const absl::Time start_ = absl::Now();
  const GenerateCallbacks transport_;
  const std::function<void()> on_error_;
  absl::Mutex mu_;
  std::vector<Candidate> candidates_ ABSL_GUARDED_BY(mu_);
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // the first failure
  int64_t input_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  JobTimes times_ ABSL_GUARDED_BY(mu_);
  std::optional<double> first_token_seconds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_SERVER_CORE_CHOICES_H_
