// Tokenizer: text <-> token ids at byte, character or word level, stored in
// the checkpoint as tokenizer.json. Torch-free so any layer may use it.
#ifndef TXL_MODEL_TOKENIZER_H_
#define TXL_MODEL_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace txl {

enum class TokenizerKind { kByte, kChar, kWord };

// A copyable value. Immutable after construction, so const methods may be
// called from any number of threads at once.
//
// JSON: {"type": "byte"} | {"type": "char"|"word", "symbols": [...]}, where a
// symbol is a JSON string if it is valid UTF-8, else a list of byte values
// (JSON strings cannot hold invalid UTF-8).
class Tokenizer {
 public:
  static Tokenizer Byte();  // 256 ids, id == byte value
  // Character level: the vocab is the sorted set of characters (UTF-8 code
  // points) of the corpus. Bytes that are not valid UTF-8 become single-byte
  // symbols, so any byte string round-trips. add_unk appends "<unk>" last, so
  // character ids do not depend on it. Fails on an empty corpus.
  static absl::StatusOr<Tokenizer> CharFromCorpus(std::string_view corpus, bool add_unk = false);
  // Word level: one token per line (line order = id). Fails on a missing or
  // empty file, a blank line, or a duplicate token (naming the lines).
  static absl::StatusOr<Tokenizer> WordFromVocabFile(const std::string& path);
  static absl::StatusOr<Tokenizer> WordFromSymbols(std::vector<std::string> symbols);
  static absl::StatusOr<Tokenizer> FromJson(std::string_view json);
  std::string ToJson() const;

  TokenizerKind kind() const { return kind_; }
  int64_t vocab_size() const { return static_cast<int64_t>(symbols_.size()); }
  // Same kind and the same symbols for the same ids: a history read by one
  // means the same text to the other.
  bool SameVocabulary(const Tokenizer& other) const { return kind_ == other.kind_ && symbols_ == other.symbols_; }

  // Unknown symbols map to "<unk>" if the vocab has one, else InvalidArgument
  // naming the character or word and its byte offset. Word level splits on
  // whitespace as Python's str.split() does; each "\n" becomes "<eos>" if the
  // vocab has it (one <eos> per line, as in the original TXL corpora).
  absl::StatusOr<std::vector<int>> Encode(std::string_view text) const;
  // Byte and char level: concatenated symbol bytes (the inverse of Encode).
  // Word level: words joined by single spaces, "<eos>" as "\n" without spaces.
  absl::StatusOr<std::string> Decode(absl::Span<const int> ids) const;
  // The bytes of one id; for word level the word itself (also "<eos>").
  absl::StatusOr<std::string> TokenText(int id) const;

 private:
  Tokenizer(TokenizerKind kind, std::vector<std::string> symbols);

  TokenizerKind kind_;
  std::vector<std::string> symbols_;  // id -> bytes
  std::unordered_map<std::string, int> ids_;
  int unk_id_ = -1;  // -1: not in the vocab
  int eos_id_ = -1;
};

}  // namespace txl

#endif  // TXL_MODEL_TOKENIZER_H_
