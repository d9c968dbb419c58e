// libFuzzer target: the tokenizer (model/tokenizer.h) at byte, char and word
// level, and tokenizer.json. Beyond "no crash, no sanitizer report" it checks
// the round trips the header promises (docs/ROBUSTNESS.md lists them):
//   byte:  Decode(Encode(x)) == x for any bytes x.
//   char:  a vocab built from a corpus encodes that corpus, and
//          Decode(Encode(x)) == x whenever Encode(x) succeeds without <unk>.
//   word:  Encode(Decode(ids)) == ids for any ids in range (words are joined
//          by single spaces, <eos> is "\n"), and Encode is idempotent through
//          Decode for any text it accepts.
//   json:  FromJson(ToJson(t)) is t again.
// A broken property calls __builtin_trap(), which libFuzzer reports as a crash.
//
// Input: byte 0 picks the mode (byte, char, char with <unk>, word, JSON); the
// rest splits at its first NUL byte into a first part (corpus, vocab lines or
// JSON) and a second (text to encode, or ids as 2-byte values); with no NUL
// the second part is empty. Byte mode uses both parts, NUL included.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace {

using txl::Tokenizer;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tokenizer_fuzzer: property broken: %s\n", what);
    __builtin_trap();
  }
}

bool Contains(const std::vector<int>& ids, int id) {
  for (int i : ids)
    if (i == id) return true;
  return false;
}

int UnkId(const Tokenizer& t) {
  for (int i = 0; i < t.vocab_size(); ++i)
    if (*t.TokenText(i) == "<unk>") return i;
  return -1;
}

// Ids in range, taken two bytes at a time from `bytes`.
std::vector<int> IdsFrom(const std::string& bytes, int64_t vocab) {
  std::vector<int> ids;
  for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
    const int v = static_cast<unsigned char>(bytes[i]) << 8 | static_cast<unsigned char>(bytes[i + 1]);
    ids.push_back(static_cast<int>(v % vocab));
  }
  return ids;
}

// Properties every tokenizer has, whatever its kind.
void CheckCommon(const Tokenizer& t, const std::string& text) {
  const int64_t V = t.vocab_size();
  Check(V > 0, "a tokenizer has at least one symbol");
  Check(!t.TokenText(-1).ok() && !t.TokenText(static_cast<int>(V)).ok(), "TokenText refuses ids out of range");
  Check(!t.Decode(std::vector<int>{static_cast<int>(V)}).ok(), "Decode refuses ids out of range");
  for (int64_t i = 0; i < V && i < 512; ++i)
    Check(t.TokenText(static_cast<int>(i)).ok(), "TokenText of an id in range");

  // JSON round trip.
  const std::string json = t.ToJson();
  absl::StatusOr<Tokenizer> back = Tokenizer::FromJson(json);
  Check(back.ok(), "FromJson(ToJson(t)) succeeds");
  Check(back->ToJson() == json, "FromJson(ToJson(t)).ToJson() == t.ToJson()");
  Check(back->kind() == t.kind() && back->vocab_size() == V, "the JSON round trip keeps kind and size");
  absl::StatusOr<std::vector<int>> a = t.Encode(text), b = back->Encode(text);
  Check(a.ok() == b.ok(), "a round-tripped tokenizer accepts the same text");
  if (a.ok()) Check(*a == *b, "a round-tripped tokenizer encodes the same");
  if (!a.ok()) Check(a.status().code() == absl::StatusCode::kInvalidArgument, "Encode fails with INVALID_ARGUMENT");

  if (a.ok()) {
    for (int id : *a) Check(id >= 0 && id < V, "Encode yields ids in range");
    absl::StatusOr<std::string> decoded = t.Decode(*a);
    Check(decoded.ok(), "Decode accepts what Encode made");
    const int unk = UnkId(t);
    if (t.kind() != txl::TokenizerKind::kWord && (unk < 0 || !Contains(*a, unk))) {
      Check(*decoded == text, "Decode(Encode(x)) == x (byte and char level, no <unk>)");
    }
    if (t.kind() == txl::TokenizerKind::kWord) {
      absl::StatusOr<std::vector<int>> again = t.Encode(*decoded);
      Check(again.ok() && *again == *a, "word level: Encode(Decode(Encode(x))) == Encode(x)");
    }
  }
}

void FuzzByte(const std::string& text) {
  Tokenizer t = Tokenizer::Byte();
  Check(t.vocab_size() == 256, "the byte tokenizer has 256 ids");
  absl::StatusOr<std::vector<int>> ids = t.Encode(text);
  Check(ids.ok() && ids->size() == text.size(), "byte level encodes any bytes, one id per byte");
  Check(*t.Decode(*ids) == text, "byte level: Decode(Encode(x)) == x");
  CheckCommon(t, text);
}

void FuzzChar(const std::string& corpus, bool add_unk, const std::string& text) {
  absl::StatusOr<Tokenizer> t = Tokenizer::CharFromCorpus(corpus, add_unk);
  Check(t.ok() == !corpus.empty(), "CharFromCorpus fails exactly on an empty corpus");
  if (!t.ok()) return;
  Check(t->vocab_size() <= static_cast<int64_t>(corpus.size()) + (add_unk ? 1 : 0),
        "no more symbols than corpus bytes");
  absl::StatusOr<std::vector<int>> ids = t->Encode(corpus);
  Check(ids.ok(), "a char vocab encodes its own corpus");
  Check(*t->Decode(*ids) == corpus, "a char vocab round-trips its own corpus");
  if (add_unk) Check(t->Encode(text).ok(), "with <unk>, any text encodes");
  CheckCommon(*t, text);
}

void FuzzWord(const std::string& lines, const std::string& rest) {
  std::vector<std::string> symbols;
  for (size_t start = 0; start <= lines.size();) {
    size_t end = lines.find('\n', start);
    if (end == std::string::npos) end = lines.size();
    symbols.push_back(lines.substr(start, end - start));
    start = end + 1;
  }
  absl::StatusOr<Tokenizer> t = Tokenizer::WordFromSymbols(symbols);
  if (!t.ok()) {
    Check(t.status().code() == absl::StatusCode::kInvalidArgument, "WordFromSymbols fails with INVALID_ARGUMENT");
    return;
  }
  Check(t->vocab_size() == static_cast<int64_t>(symbols.size()), "one id per symbol");
  const std::vector<int> ids = IdsFrom(rest, t->vocab_size());
  absl::StatusOr<std::string> text = t->Decode(ids);
  Check(text.ok(), "Decode accepts ids in range");
  absl::StatusOr<std::vector<int>> again = t->Encode(*text);
  Check(again.ok() && *again == ids, "word level: Encode(Decode(ids)) == ids");
  CheckCommon(*t, rest);
}

void FuzzJson(const std::string& json, const std::string& text) {
  absl::StatusOr<Tokenizer> t = Tokenizer::FromJson(json);
  if (!t.ok()) {
    Check(t.status().code() == absl::StatusCode::kInvalidArgument, "FromJson fails with INVALID_ARGUMENT");
    Check(t.status().message().rfind("tokenizer.json: ", 0) == 0, "FromJson's errors name tokenizer.json");
    return;
  }
  CheckCommon(*t, text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 5;
  const std::string all(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nul = all.find('\0');
  const std::string first = all.substr(0, nul);
  const std::string rest = nul == std::string::npos ? "" : all.substr(nul + 1);
  switch (mode) {
    case 0: FuzzByte(all); break;
    case 1: FuzzChar(first, false, rest); break;
    case 2: FuzzChar(first, true, rest); break;
    case 3: FuzzWord(first, rest); break;
    case 4: FuzzJson(first, rest); break;
  }
  return 0;
}
