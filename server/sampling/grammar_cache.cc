#include "server/sampling/grammar_cache.h"

#include "base/status_macros.h"

namespace txl {

absl::StatusOr<CheckedGrammar> GrammarCache::Get(const std::string& text) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(text); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Parsed and checked outside the lock: another request's grammar need not wait.
  CheckedGrammar checked;
  ASSIGN_OR_RETURN(checked.grammar, Grammar::Parse(text));
  if (!GrammarState(checked.grammar).CanContinue()) {
    return absl::InvalidArgumentError("grammar: root matches only the empty text");
  }
  checked.masker = TokenMasker::Create(checked.grammar, tokenizer_, config_.masker);
  if (!checked.masker->SomeTokenCanBegin()) {
    return absl::InvalidArgumentError(
        "grammar: no token of the model's vocabulary can begin it (root's first characters are not in it)");
  }
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(text); it != index_.end()) return it->second->second;  // a racing request's
  lru_.emplace_front(text, checked);
  index_[text] = lru_.begin();
  while (static_cast<int>(lru_.size()) > config_.capacity) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return checked;
}

}  // namespace txl
