// TokenMasker: which tokens of a model's vocabulary may come next under a
// grammar (constrained output, GenerateJob). Two things make it cheap for a
// large (word) vocabulary:
//   - it walks the symbols in byte order (Tokenizer::ids_in_text_order), so
//     symbols that share a prefix share its steps, and a prefix the grammar
//     refuses skips every symbol under it;
//   - it remembers the grammar's steps between parse sets (a deterministic
//     automaton built as it is met) and the mask of each parse set and word
//     context it has walked: a later step from the same place is a lookup.
// One masker serves every generation of one grammar on one model (the
// choices of a call, and the calls that send the same grammar:
// GrammarCache), so the work is done once for all of them.
//
// Threading: thread-safe (one mutex; a walk holds it). Masks are immutable.
#ifndef TXL_SERVER_SAMPLING_TOKEN_MASKER_H_
#define TXL_SERVER_SAMPLING_TOKEN_MASKER_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "model/step.h"
#include "model/tokenizer.h"
#include "server/sampling/grammar.h"

namespace txl {

struct TokenMaskerLimits {
  // Parse sets remembered (each about 1 KiB and its stacks). A walk that
  // meets more steps the rest without remembering them, so one grammar's
  // walk is bounded whatever the vocabulary; the next Next starts again.
  int max_states = 2048;
  int64_t max_stack_positions = 1 << 18;  // summed over the remembered parse sets (12 bytes each)
  int64_t max_mask_bytes = 4 << 20;       // masks kept (vocab/8 bytes each); past it they are dropped
};

struct TokenMask {
  AllowedTokens bits;  // by token id, as the model's constrained pick takes it
  int64_t count = 0;   // tokens allowed
  int64_t vocab = 0;   // the vocabulary's size: tokens 0..vocab-1
};

class TokenMasker {
 public:
  // The tokenizer must outlive the masker (it is the served model's).
  static std::shared_ptr<TokenMasker> Create(std::shared_ptr<const Grammar> grammar, const Tokenizer& tokenizer,
                                             const TokenMaskerLimits& limits = {});

  // The tokens whose text (Tokenizer::AppendedText: at word level with a
  // space before a word when after_word) the state allows next.
  std::shared_ptr<const TokenMask> Next(const GrammarState& state, bool after_word) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether some token can begin the grammar's text, in either word context.
  bool SomeTokenCanBegin() ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    int64_t walks = 0;          // masks computed by a walk over the vocabulary
    int64_t reused = 0;         // masks answered from what was kept
    int64_t unremembered = 0;   // steps taken past the limits, not remembered
    int64_t masks_dropped = 0;  // kept masks dropped for max_mask_bytes
    int states = 0;             // parse sets in the automaton now
    int64_t mask_bytes = 0;     // of the masks kept now
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  TokenMasker(std::shared_ptr<const Grammar> grammar, const Tokenizer& tokenizer, const TokenMaskerLimits& limits);

  // Node ids: >= 0 a remembered parse set; kDead none; at or below
  // kUnremembered, a walk's parse set at depth kUnremembered - id, held in
  // path_ while the walk is below it (past the limits).
  static constexpr int kUnknown = -2, kDead = -1, kUnremembered = -3;
  using Stacks = std::vector<GrammarState::Stack>;
  struct Node {
    const Stacks* stacks = nullptr;             // the key in ids_
    std::array<int32_t, 256> next;              // by byte: a node, kDead, or kUnknown
    std::shared_ptr<const TokenMask> masks[2];  // by after_word
  };
  // The node of `stacks`: remembered, or (past the limits) kept at path_[depth].
  int Intern(Stacks stacks, size_t depth) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Stacks& StacksOf(int node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node after `byte` from `node`, which is `depth` bytes into the walk.
  int Go(int node, unsigned char byte, size_t depth) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<const TokenMask> Walk(int node, bool after_word, bool first_only) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reset() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Tokenizer& tokenizer_;
  const TokenMaskerLimits limits_;
  mutable absl::Mutex mu_;
  // The start, and what steps the parse sets (a step writes its truncated_).
  const GrammarState start_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<Stacks, int> ids_ ABSL_GUARDED_BY(mu_);
  int64_t stack_positions_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Stacks> path_ ABSL_GUARDED_BY(mu_);  // a walk's parse sets past the limits, by depth
  int64_t mask_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_SERVER_SAMPLING_TOKEN_MASKER_H_
