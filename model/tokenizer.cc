#include "model/tokenizer.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/read_file.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace txl {
namespace {

using json = nlohmann::json;

constexpr std::string_view kUnk = "<unk>";
constexpr std::string_view kEos = "<eos>";

// Length (1-4) of the well-formed UTF-8 sequence starting at s[pos], or 0 if
// none does (stray continuation byte, overlong form, surrogate, > U+10FFFF,
// truncated sequence). Sets *cp to the code point.
int Utf8SeqLen(std::string_view s, size_t pos, uint32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[pos + i]); };
  const unsigned c0 = byte(0);
  if (c0 < 0x80) {
    *cp = c0;
    return 1;
  }
  int len;
  uint32_t v;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
    v = c0 & 0x1F;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    v = c0 & 0x0F;
    if (c0 == 0xE0) lo = 0xA0;  // overlong
    if (c0 == 0xED) hi = 0x9F;  // surrogates
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    v = c0 & 0x07;
    if (c0 == 0xF0) lo = 0x90;  // overlong
    if (c0 == 0xF4) hi = 0x8F;  // > U+10FFFF
  } else {
    return 0;
  }
  if (s.size() - pos < static_cast<size_t>(len)) return 0;
  for (int i = 1; i < len; ++i) {
    const unsigned c = byte(i);
    if (c < (i == 1 ? lo : 0x80u) || c > (i == 1 ? hi : 0xBFu)) return 0;
    v = (v << 6) | (c & 0x3F);
  }
  *cp = v;
  return len;
}

bool IsValidUtf8(std::string_view s) {
  uint32_t cp;
  for (size_t pos = 0; pos < s.size();) {
    const int n = Utf8SeqLen(s, pos, &cp);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

// Python's str.isspace(), so that Encode splits words exactly as the
// original TXL corpus code (line.split()) did when the vocab was built.
bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool HasSpace(std::string_view s) {
  uint32_t cp;
  for (size_t pos = 0; pos < s.size();) {
    const int n = Utf8SeqLen(s, pos, &cp);
    if (n > 0 && IsPySpace(cp)) return true;
    pos += n > 0 ? n : 1;
  }
  return false;
}

std::string HexUpper(uint32_t v, int min_digits) {
  std::string out;
  while (v != 0 || static_cast<int>(out.size()) < min_digits) {
    out.insert(out.begin(), "0123456789ABCDEF"[v & 0xF]);
    v >>= 4;
  }
  return out;
}

// Symbol text safe to put in an error message. (Debian's absl::string_view
// is not std::string_view, hence the explicit conversion.)
std::string Printable(std::string_view s) {
  bool plain = IsValidUtf8(s);
  for (char c : s) plain &= static_cast<unsigned char>(c) >= 0x20 && c != 0x7F;
  return plain ? std::string(s) : absl::CHexEscape(absl::string_view(s.data(), s.size()));
}

std::string OutOfRange(int id, size_t size) {
  return absl::StrCat("token id ", id, " is out of range [0, ", size, ")");
}

// Why `s` cannot be a symbol of a vocab of this kind; empty if it can.
std::string SymbolProblem(TokenizerKind kind, std::string_view s) {
  if (s.empty()) return "is empty";
  if (kind == TokenizerKind::kChar) {
    if (s == kUnk) return "";
    uint32_t cp;
    const int n = Utf8SeqLen(s, 0, &cp);
    if (n > 0 ? static_cast<size_t>(n) == s.size() : s.size() == 1) return "";
    return absl::StrCat("must be one character (UTF-8 code point), one byte or \"<unk>\", got '", Printable(s), "'");
  }
  // Encode splits on whitespace, so such a word could never be produced.
  if (kind == TokenizerKind::kWord && HasSpace(s)) return absl::StrCat("contains whitespace: '", Printable(s), "'");
  return "";
}

// Checks emptiness, each symbol and duplicates; name(i) names entry i for
// the message ("symbols[3]", "line 4").
template <typename Name>
absl::Status CheckSymbols(TokenizerKind kind, const std::vector<std::string>& symbols, const std::string& prefix,
                          Name name) {
  if (symbols.empty()) return absl::InvalidArgumentError(absl::StrCat(prefix, "no symbols"));
  if (symbols.size() > static_cast<size_t>(INT_MAX))
    return absl::InvalidArgumentError(absl::StrCat(prefix, "too many symbols: ", symbols.size()));
  std::unordered_map<std::string_view, size_t> seen;
  for (size_t i = 0; i < symbols.size(); ++i) {
    const std::string problem = SymbolProblem(kind, symbols[i]);
    if (!problem.empty()) return absl::InvalidArgumentError(absl::StrCat(prefix, name(i), " ", problem));
    auto [it, inserted] = seen.emplace(symbols[i], i);
    if (!inserted)
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, name(i), " duplicates ", name(it->second), " ('", Printable(symbols[i]), "')"));
  }
  return absl::OkStatus();
}

std::string Abbreviated(const json& j) {
  std::string s = j.dump();
  return s.size() <= 40 ? s : s.substr(0, 37) + "...";
}

}  // namespace

Tokenizer::Tokenizer(TokenizerKind kind, std::vector<std::string> symbols) : kind_(kind), symbols_(std::move(symbols)) {
  for (int i = 0; i < static_cast<int>(symbols_.size()); ++i) {
    if (kind_ != TokenizerKind::kWord || symbols_[static_cast<size_t>(i)] != kEos) text_order_.push_back(i);
  }
  std::sort(text_order_.begin(), text_order_.end(),
            [&](int a, int b) { return symbols_[static_cast<size_t>(a)] < symbols_[static_cast<size_t>(b)]; });
  shared_prefix_.assign(text_order_.size(), 0);
  for (size_t i = 1; i < text_order_.size(); ++i) {
    const std::string& a = symbols_[static_cast<size_t>(text_order_[i - 1])];
    const std::string& b = symbols_[static_cast<size_t>(text_order_[i])];
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    shared_prefix_[i] = static_cast<int>(n);
  }
  if (kind_ == TokenizerKind::kByte) return;  // Encode needs no lookup
  ids_.reserve(symbols_.size());
  for (size_t i = 0; i < symbols_.size(); ++i) ids_.emplace(symbols_[i], static_cast<int>(i));
  if (auto it = ids_.find(std::string(kUnk)); it != ids_.end()) unk_id_ = it->second;
  if (kind_ == TokenizerKind::kWord) {
    if (auto it = ids_.find(std::string(kEos)); it != ids_.end()) eos_id_ = it->second;
  }
}

Tokenizer Tokenizer::Byte() {
  std::vector<std::string> symbols;
  symbols.reserve(256);
  for (int b = 0; b < 256; ++b) symbols.emplace_back(1, static_cast<char>(b));
  return Tokenizer(TokenizerKind::kByte, std::move(symbols));
}

absl::StatusOr<Tokenizer> Tokenizer::CharFromCorpus(std::string_view corpus, bool add_unk) {
  if (corpus.empty())
    return absl::InvalidArgumentError(
        "tokenizer: cannot build a character vocabulary from an "
        "empty corpus");
  // Flags instead of a set: corpora such as enwik8 are 100M characters.
  constexpr uint32_t kStrayByteBase = 0x110000;  // after the last code point
  std::vector<bool> seen(kStrayByteBase + 256);
  std::vector<std::string> symbols;
  uint32_t cp;
  for (size_t pos = 0; pos < corpus.size();) {
    int n = Utf8SeqLen(corpus, pos, &cp);
    if (n == 0) {
      n = 1;
      cp = kStrayByteBase + static_cast<unsigned char>(corpus[pos]);
    }
    if (!seen[cp]) {
      seen[cp] = true;
      symbols.emplace_back(corpus.substr(pos, n));
    }
    pos += n;
  }
  // Byte order, which for valid UTF-8 is code-point order (and Python's
  // sorted(set(text))); stray bytes fall between the characters by value.
  std::sort(symbols.begin(), symbols.end());
  if (add_unk) symbols.emplace_back(kUnk);
  return Tokenizer(TokenizerKind::kChar, std::move(symbols));
}

absl::StatusOr<Tokenizer> Tokenizer::WordFromVocabFile(const std::string& path) {
  absl::StatusOr<std::string> read = ReadFile(path);
  if (!read.ok()) return WithContext("vocab file", read.status());
  const std::string text = *std::move(read);
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("vocab file '", path, "' is empty"));
  std::vector<std::string> symbols;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // CRLF files
    symbols.emplace_back(line);
    start = end + 1;
  }
  RETURN_IF_ERROR(CheckSymbols(TokenizerKind::kWord, symbols, absl::StrCat("vocab file '", path, "': "),
                               [](size_t i) { return absl::StrCat("line ", i + 1); }));
  return Tokenizer(TokenizerKind::kWord, std::move(symbols));
}

absl::StatusOr<Tokenizer> Tokenizer::WordFromSymbols(std::vector<std::string> symbols) {
  RETURN_IF_ERROR(CheckSymbols(TokenizerKind::kWord, symbols,
                               "tokenizer: ", [](size_t i) { return absl::StrCat("symbols[", i, "]"); }));
  return Tokenizer(TokenizerKind::kWord, std::move(symbols));
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view text) {
  const auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", parts...));
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return invalid("not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) return invalid("must be a JSON object, got ", Abbreviated(j));
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "type" && it.key() != "symbols")
      return invalid("unknown key \"", it.key(), "\" (expected \"type\" and \"symbols\")");
  }
  auto type_it = j.find("type");
  if (type_it == j.end()) return invalid("missing \"type\"");
  const std::string type = type_it->is_string() ? type_it->get<std::string>() : "";
  TokenizerKind kind;
  if (type == "byte") {
    kind = TokenizerKind::kByte;
  } else if (type == "char") {
    kind = TokenizerKind::kChar;
  } else if (type == "word") {
    kind = TokenizerKind::kWord;
  } else {
    return invalid("\"type\" must be \"byte\", \"char\" or \"word\", got ", Abbreviated(*type_it));
  }
  auto sym_it = j.find("symbols");
  if (kind == TokenizerKind::kByte) {
    if (sym_it != j.end()) return invalid("a byte tokenizer takes no \"symbols\"");
    return Byte();
  }
  if (sym_it == j.end()) return invalid("a ", type, " tokenizer needs \"symbols\"");
  if (!sym_it->is_array()) return invalid("\"symbols\" must be a list, got ", Abbreviated(*sym_it));
  std::vector<std::string> symbols;
  symbols.reserve(sym_it->size());
  for (size_t i = 0; i < sym_it->size(); ++i) {
    const json& e = (*sym_it)[i];
    if (e.is_string()) {
      symbols.push_back(e.get<std::string>());
      continue;
    }
    // Not valid UTF-8: a list of byte values.
    bool ok = e.is_array() && !e.empty();
    std::string bytes;
    if (ok) {
      for (const json& b : e) {
        ok = b.is_number_integer() && b.get<int64_t>() >= 0 && b.get<int64_t>() <= 255;
        if (!ok) break;
        bytes.push_back(static_cast<char>(b.get<int64_t>()));
      }
    }
    if (!ok) return invalid("symbols[", i, "] must be a string or a list of byte values (0-255), got ", Abbreviated(e));
    symbols.push_back(std::move(bytes));
  }
  RETURN_IF_ERROR(
      CheckSymbols(kind, symbols, "tokenizer.json: ", [](size_t i) { return absl::StrCat("symbols[", i, "]"); }));
  return Tokenizer(kind, std::move(symbols));
}

std::string Tokenizer::ToJson() const {
  nlohmann::ordered_json j;  // "type" first, for people reading the file
  if (kind_ == TokenizerKind::kByte) {
    j["type"] = "byte";
    return j.dump();
  }
  j["type"] = kind_ == TokenizerKind::kChar ? "char" : "word";
  nlohmann::ordered_json symbols = nlohmann::ordered_json::array();
  for (const std::string& s : symbols_) {
    if (IsValidUtf8(s)) {
      symbols.push_back(s);
    } else {
      std::vector<int> bytes;
      for (char c : s) bytes.push_back(static_cast<unsigned char>(c));
      symbols.push_back(bytes);
    }
  }
  j["symbols"] = std::move(symbols);
  return j.dump();
}

absl::StatusOr<std::vector<int>> Tokenizer::Encode(std::string_view text) const {
  std::vector<int> ids;
  if (kind_ == TokenizerKind::kByte) {
    ids.reserve(text.size());
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  uint32_t cp;
  if (kind_ == TokenizerKind::kChar) {
    ids.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
      const int n = Utf8SeqLen(text, pos, &cp);
      const std::string sym(text.substr(pos, n > 0 ? n : 1));
      if (auto it = ids_.find(sym); it != ids_.end()) {
        ids.push_back(it->second);
      } else if (unk_id_ >= 0) {
        ids.push_back(unk_id_);
      } else if (n > 0) {
        return absl::InvalidArgumentError(absl::StrCat("character '", Printable(sym), "' (U+", HexUpper(cp, 4),
                                                       ") at byte ", pos, " is not in the vocabulary"));
      } else {
        return absl::InvalidArgumentError(absl::StrCat("byte 0x", HexUpper(static_cast<unsigned char>(sym[0]), 2),
                                                       " (not valid UTF-8) at byte ", pos,
                                                       " is not in the vocabulary"));
      }
      pos += sym.size();
    }
    return ids;
  }
  // Word level.
  size_t word_start = std::string_view::npos;
  const auto flush = [&](size_t end) -> absl::Status {
    if (word_start == std::string_view::npos) return absl::OkStatus();
    const std::string word(text.substr(word_start, end - word_start));
    if (auto it = ids_.find(word); it != ids_.end()) {
      ids.push_back(it->second);
    } else if (unk_id_ >= 0) {
      ids.push_back(unk_id_);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("word '", Printable(word), "' at byte ", word_start, " is not in the vocabulary"));
    }
    word_start = std::string_view::npos;
    return absl::OkStatus();
  };
  for (size_t pos = 0; pos < text.size();) {
    const int n = Utf8SeqLen(text, pos, &cp);
    if (n > 0 && IsPySpace(cp)) {
      RETURN_IF_ERROR(flush(pos));
      if (cp == '\n' && eos_id_ >= 0) ids.push_back(eos_id_);
    } else if (word_start == std::string_view::npos) {
      word_start = pos;
    }
    pos += n > 0 ? n : 1;
  }
  RETURN_IF_ERROR(flush(text.size()));
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int> ids) const {
  std::string out;
  bool need_space = false;  // word level: a word was written since the last newline
  for (size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= symbols_.size())
      return absl::InvalidArgumentError(absl::StrCat(OutOfRange(id, symbols_.size()), " (at index ", i, ")"));
    if (kind_ != TokenizerKind::kWord) {
      out += symbols_[id];
    } else if (id == eos_id_) {
      out += '\n';
      need_space = false;
    } else {
      if (need_space) out += ' ';
      out += symbols_[id];
      need_space = true;
    }
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::TokenText(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= symbols_.size())
    return absl::InvalidArgumentError(OutOfRange(id, symbols_.size()));
  return symbols_[id];
}

absl::StatusOr<std::string> Tokenizer::AppendedText(int id, bool* after_word) const {
  if (id < 0 || static_cast<size_t>(id) >= symbols_.size())
    return absl::InvalidArgumentError(OutOfRange(id, symbols_.size()));
  if (kind_ != TokenizerKind::kWord) return symbols_[static_cast<size_t>(id)];
  if (id == eos_id_) {
    *after_word = false;
    return std::string("\n");
  }
  std::string text = *after_word ? absl::StrCat(" ", symbols_[static_cast<size_t>(id)]) : symbols_[id];
  *after_word = true;
  return text;
}

}  // namespace txl
