// GrammarCache: the grammars one model's requests sent last, parsed and
// checked against its vocabulary, each with its TokenMasker, so that calls
// sending the same grammar (or the same response_format) share the masks'
// work and skip the parse. Least recently used out first.
//
// Threading: thread-safe (one mutex); entries are shared, immutable grammars
// and thread-safe maskers.
#ifndef TXL_SERVER_SAMPLING_GRAMMAR_CACHE_H_
#define TXL_SERVER_SAMPLING_GRAMMAR_CACHE_H_

#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "model/tokenizer.h"
#include "server/sampling/grammar.h"
#include "server/sampling/token_masker.h"

namespace txl {

struct GrammarCacheConfig {
  int capacity = 16;  // grammars kept; each keeps up to TokenMaskerLimits' masks and parse sets
  TokenMaskerLimits masker;
};

struct CheckedGrammar {
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<TokenMasker> masker;
};

class GrammarCache {
 public:
  // The tokenizer must outlive the cache (both are the served model's).
  explicit GrammarCache(const Tokenizer& tokenizer, GrammarCacheConfig config = {})
      : tokenizer_(tokenizer), config_(std::move(config)) {}

  // The grammar of `text`, kept or parsed now: INVALID_ARGUMENT (from
  // Grammar::Parse, or "grammar: root matches only the empty text", or
  // "grammar: no token of the model's vocabulary can begin it ...") when it
  // cannot be followed on this vocabulary. Refusals are not kept.
  absl::StatusOr<CheckedGrammar> Get(const std::string& text) ABSL_LOCKS_EXCLUDED(mu_);

  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  const Tokenizer& tokenizer_;
  const GrammarCacheConfig config_;
  absl::Mutex mu_;
  std::list<std::pair<std::string, CheckedGrammar>> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  std::unordered_map<std::string, std::list<std::pair<std::string, CheckedGrammar>>::iterator> index_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_SERVER_SAMPLING_GRAMMAR_CACHE_H_
