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
  // The bytes id adds to a decoded text, as Decode writes it: the symbol at
  // byte and char level; at word level "\n" for <eos>, and a word with a
  // space before it when *after_word (a word since the last newline).
  // Updates *after_word.
  absl::StatusOr<std::string> AppendedText(int id, bool* after_word) const;
  // Whether a word-level text ending in id goes on with a space (id is a
  // word, not <eos>); false at byte and char level.
  bool EndsAfterWord(int id) const { return kind_ == TokenizerKind::kWord && id >= 0 && id != eos_id_; }
  int eos_id() const { return eos_id_; }  // -1: none (always at byte and char level)

  // The ids in the byte order of their symbols (<eos> left out at word
  // level), and for each the length of the prefix it shares with the one
  // before it: a walk over every symbol that shares work between common
  // prefixes (server/sampling/token_masker.h).
  const std::vector<int>& ids_in_text_order() const { return text_order_; }
  const std::vector<int>& shared_prefix() const { return shared_prefix_; }
  const std::vector<std::string>& symbols() const { return symbols_; }  // by id

 private:
  Tokenizer(TokenizerKind kind, std::vector<std::string> symbols);

  TokenizerKind kind_;
  std::vector<std::string> symbols_;  // id -> bytes
  std::unordered_map<std::string, int> ids_;
  int unk_id_ = -1;  // -1: not in the vocab
  int eos_id_ = -1;
  std::vector<int> text_order_, shared_prefix_;
};

}  // namespace txl

#endif  // TXL_MODEL_TOKENIZER_H_
