// What each job kind answers with, and the callbacks that take it. A kind's
// answer is its own type: Generate and Score end with a status and their
// result (a cancelled generation succeeds with what it sent); the session
// kinds end with a StatusOr of the one thing they make, or a status alone.
// JobRunner::Finish calls the answer exactly once per accepted job.
#ifndef TXL_SERVER_JOBS_JOB_RESULTS_H_
#define TXL_SERVER_JOBS_JOB_RESULTS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/sessions/session_table.h"

namespace txl {

struct ScoredTokenResult {
  int id = 0;
  bool has_logprob = false;  // false: no earlier token in the session
  float logprob = 0;
};

struct GeneratedTokenEvent {
  int id = 0;
  std::string text;  // whole UTF-8 characters only; may be empty
  float logprob = 0;
  std::vector<std::pair<int, float>> top;  // when top_logprobs > 0
  // Word level: a word came before this token since the last newline, so
  // its text (and an alternative's) has a space before it (Tokenizer::AppendedText).
  bool after_word = false;
  std::vector<ScoredTokenResult> echo;  // with the first token, when echo is asked for
  int choice = 0;                       // of a call with several (ServiceCore::Generate's n)
};

enum class Finish { kLength, kStopToken, kStopSequence, kCancelled };

// Seconds from submission, as every feeding kind reports them.
struct JobTimes {
  double queue_seconds = 0;        // until the engine thread took the job
  double first_token_seconds = 0;  // Generate: until its first token
  double total_seconds = 0;        // until its end
};

// One choice's end, in a call with several (ServiceCore::Generate's n).
struct ChoiceEnd {
  int index = 0;
  Finish finish = Finish::kLength;
  int64_t generated_tokens = 0;
  int64_t position = 0;       // its throw-away session's, afterwards
  std::string trailing_text;  // as GenerateResult's
  bool sent = false;          // given to GenerateCallbacks::on_choice_end as it came
};

struct GenerateResult {
  std::string session_id;  // empty: a throw-away session
  Finish finish = Finish::kLength;
  int64_t position = 0;  // the session's position afterwards
  int64_t input_tokens = 0;
  int64_t generated_tokens = 0;
  JobTimes times;
  std::string trailing_text;            // text held back until the end (e.g. a partial character)
  std::vector<ScoredTokenResult> echo;  // echo with no token generated (max_new_tokens none)
  // A call with several choices: each one's end, by index; the fields above
  // are then the call's (the prompt once, every candidate's tokens).
  std::vector<ChoiceEnd> choices;
};

struct ScoreResult {
  int64_t position = 0;  // the session's position afterwards (unchanged without commit)
  std::vector<ScoredTokenResult> scores;
};

// Generate's tokens as they are produced, with the session position after them.
using TokensCallback = std::function<void(std::vector<GeneratedTokenEvent>, int64_t position)>;
struct GenerateCallbacks {
  TokensCallback on_tokens;
  std::function<void(absl::Status, GenerateResult)> on_done;
  // Several choices (n > 1, best_of == n): a choice that ends before the
  // last one, as it ends, after its tokens (its end is then marked `sent` in
  // on_done's GenerateResult::choices). Unset: every end comes with on_done.
  std::function<void(ChoiceEnd)> on_choice_end;
};
using ScoreDone = std::function<void(absl::Status, ScoreResult)>;
using SessionMade = std::function<void(absl::StatusOr<SessionInfo>)>;  // Fork, Import
using ExportDone = std::function<void(absl::StatusOr<std::string>)>;   // EncodeSessionExport's bytes
using JobDone = std::function<void(absl::Status)>;                     // Rewind, Adopt

}  // namespace txl

#endif  // TXL_SERVER_JOBS_JOB_RESULTS_H_
