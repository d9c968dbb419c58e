// What one engine step takes and gives, and the session state it advances:
// the one input type from the scheduler down to the model (torch-free).
// The server's Engine interface (server/engine/engine.h) speaks these types,
// so a request's tokens go from the job's feed straight into a StepInput.
#ifndef TXL_MODEL_STEP_H_
#define TXL_MODEL_STEP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace txl {

// One session's model state (its layer memories). The model's sessions
// implement it (language_model.cc); the scheduler's tests use a fake one.
// Driven by one thread at a time (the engine thread).
class SessionState {
 public:
  virtual ~SessionState() = default;
  virtual int64_t position() const = 0;       // tokens in the memory's history
  virtual int64_t mem_len() const = 0;        // attention window, in keys
  virtual int64_t memory_tokens() const = 0;  // positions held (<= mem_len - 1)
  virtual int64_t memory_bytes() const = 0;   // allocated now
  // memory_bytes once the window is full: admission control reserves it.
  virtual int64_t full_memory_bytes() const = 0;
  // Deep copy (fork); RESOURCE_EXHAUSTED when the device is out of memory.
  virtual absl::StatusOr<std::unique_ptr<SessionState>> Clone() const = 0;
  // Appends an exact byte image of the state (the engine's RestoreSession
  // reads it back); INTERNAL if the device copy fails.
  virtual absl::Status AppendTo(std::string* out) const = 0;
};

// The tokens a constrained pick may take (SamplingPlan::allowed): token id
// t is allowed when bit t % 64 of words[t / 64] is set.
struct AllowedTokens {
  std::vector<uint64_t> words;
  bool contains(int64_t id) const {
    return id >= 0 && static_cast<size_t>(id / 64) < words.size() && ((words[id / 64] >> (id % 64)) & 1) != 0;
  }
};

// What leaves the model for the token after the last one, instead of the
// whole distribution: nothing (kNone, no list), the model's own pick (argmax
// or a draw), a nucleus listing, the top-n list. A list can come with a
// pick. The request's sampler builds it (Sampler::Plan).
struct SamplingPlan {
  // The model picks the token after the last one itself and returns only
  // its id and log-prob (n_token floats neither leave the device nor get
  // copied). kArgmax: the most likely (ties: the lower id). kDraw: an exact
  // draw at temperature 1 by inverse CDF in token-id order at `uniform`;
  // through an adaptive softmax it draws the head entry first and computes
  // only the drawn cluster's logits. The same u gives the token that walking
  // the whole distribution in id order gives (Sampler's DrawInIdOrder).
  enum class Pick { kNone, kArgmax, kDraw };
  Pick pick = Pick::kNone;
  double uniform = 0;  // kDraw: the draw's u, in [0, 1)
  // kDraw and the nucleus listing. kDraw at another temperature than 1
  // walks the whole row's tempered weights exp((lp - best) / T) in id
  // order, inside the model (model/kernels/sampling_kernels.h); only the
  // token leaves it. One field for both: a request's sampler asks for at
  // most one of them, at the request's temperature.
  float temperature = 1.0f;
  // In (0, 1): top-p without top-k at `temperature`. The model lists a
  // prefix of the row in the sampler's order that holds the nucleus, and
  // the row's total weight (StepOutput::nucleus, nucleus_total); the
  // request's sampler cuts and draws (Sampler::SampleFromNucleus).
  float nucleus_p = 0.0f;
  // > 0: the top_n most likely tokens after the last one, with their
  // log-probs (StepOutput::top), found in the model without whole rows (an
  // adaptive softmax computes a cluster only for rows where it can hold one
  // of them). What logprobs > 0 and top-k sampling need; independent of
  // `pick`.
  int top_n = 0;
  // A constraint (constrained output): the pick (kArgmax or kDraw) takes
  // only these tokens, exactly as from the distribution renormalised over
  // them. The unconstrained pick comes first, as above; if `allowed` holds
  // it, it is the token. Else the model picks again over the allowed tokens (the
  // others at -inf): an argmax, or the id-order draw at
  // `fallback_uniform`. Accepting a draw from p when it lands in A, and
  // else drawing from p restricted to A, gives each t in A the probability
  // p(t) + (1 - p(A)) p(t) / p(A) = p(t) / p(A): exact, and only the rows
  // whose first pick the constraint refuses compute more (the head, and the
  // clusters that hold an allowed token).
  // The picked log-prob stays the model's own (before the constraint).
  // A row with no allowed token to pick (none finite, or a NaN among them)
  // gets picked -1; the step's other rows are answered.
  // `top_n` lists are not constrained. Null: no constraint.
  std::shared_ptr<const AllowedTokens> allowed;
  double fallback_uniform = 0;  // kDraw with `allowed`: in [0, 1)

  // Nothing leaves the model for the token after the last one.
  bool empty() const { return pick == Pick::kNone && nucleus_p <= 0 && top_n <= 0; }
};

struct StepInput {
  SessionState* session = nullptr;
  std::vector<int> tokens;  // the new tokens (may be empty)
  // targets[i] is scored by the distribution after tokens[i]; at most
  // tokens.size() entries.
  std::vector<int> targets;
  bool want_target_argmax = false;      // also the most likely token at each target's position
  bool want_last_distribution = false;  // log-probs after the last token
  // What else leaves the model for the token after the last one: a pick,
  // a nucleus, a list (SamplingPlan; a request's Sampler::Plan builds it).
  SamplingPlan plan;
  // A state that admission has not counted, built beside a session's own (a
  // rewind's, a fork's or a migration's rebuild, stepped alone): on the
  // generic path its rows are refused past the session pools' budget, where
  // a counted session's are granted (slot_pool.h, SlotPool::Admitted).
  bool uncounted = false;
};

// Tokens with their log-probs, most likely first (ties: the lower id).
using TokenList = std::vector<std::pair<int, float>>;
// That order: true when a comes before b.
inline bool Likelier(const std::pair<int, float>& a, const std::pair<int, float>& b) {
  return a.second > b.second || (a.second == b.second && a.first < b.first);
}

struct StepOutput {
  std::vector<float> target_logprobs;    // one per target
  std::vector<int> target_argmax;        // when asked: the most likely token at each target's position
  std::vector<float> last_distribution;  // n_token log-probs, when asked
  int picked = -1;                       // the token plan.pick chose
  float picked_logprob = 0;              // its log-prob
  TokenList top;                         // min(plan.top_n, n_token) entries, when asked
  TokenList nucleus;                     // when plan.nucleus_p was set
  double nucleus_total = 0;
};

}  // namespace txl

#endif  // TXL_MODEL_STEP_H_
