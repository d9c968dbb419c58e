// Small helpers shared by the command-line tools (torch-free).
#ifndef TXL_TOOLS_CLI_UTIL_H_
#define TXL_TOOLS_CLI_UTIL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "model/tokenizer.h"

namespace txl {

// The tokenizer a tool's --tokenizer flag names: "char" (the characters of
// corpus_text), "byte", or "word" (one token per line of vocab_path).
inline absl::StatusOr<Tokenizer> TokenizerFromFlags(const std::string& kind, const std::string& corpus_text,
                                                    const std::string& vocab_path) {
  if (kind == "byte") return Tokenizer::Byte();
  if (kind == "char") {
    if (corpus_text.empty()) return absl::InvalidArgumentError("--tokenizer char needs a non-empty corpus");
    return Tokenizer::CharFromCorpus(corpus_text);
  }
  if (kind == "word") {
    if (vocab_path.empty()) return absl::InvalidArgumentError("--tokenizer word needs --vocab");
    return Tokenizer::WordFromVocabFile(vocab_path);
  }
  return absl::InvalidArgumentError(absl::StrCat("--tokenizer must be char, byte or word, got '", kind, "'"));
}

}  // namespace txl

#endif  // TXL_TOOLS_CLI_UTIL_H_
