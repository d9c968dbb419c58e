#include "model/tokenizer.h"

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace txl {
namespace {

// gmock's HasSubstr without linking gmock.
::testing::AssertionResult HasSubstr(const absl::Status& s, std::string_view needle) {
  // std::string: Debian's absl::string_view is not std::string_view.
  if (std::string(s.message()).find(needle) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "message \"" << s.message() << "\" lacks \"" << needle << "\"";
}

std::string RoundTrip(const Tokenizer& tok, std::string_view text) {
  absl::StatusOr<std::vector<int>> ids = tok.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  if (!ids.ok()) return "";
  absl::StatusOr<std::string> back = tok.Decode(*ids);
  EXPECT_TRUE(back.ok()) << back.status();
  return back.ok() ? *back : "";
}

std::vector<std::string> Symbols(const Tokenizer& tok) {
  std::vector<std::string> out;
  for (int i = 0; i < tok.vocab_size(); ++i) out.push_back(tok.TokenText(i).value());
  return out;
}

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/tokenizer_test_" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

Tokenizer Words(std::vector<std::string> symbols) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::WordFromSymbols(std::move(symbols));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

// The corpus of the char tests: 1-, 2-, 3- and 4-byte characters plus bytes
// that are not UTF-8 (a lone 0xFF, a truncated 3-byte sequence).
const std::string kMixedCorpus = "caf\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80\n\xFF-\xE4\xB8";

// ---- byte level ----

TEST(TokenizerTest, ByteRoundTripsAllByteValues) {
  Tokenizer tok = Tokenizer::Byte();
  EXPECT_EQ(tok.kind(), TokenizerKind::kByte);
  EXPECT_EQ(tok.vocab_size(), 256);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::vector<int> ids = tok.Encode(all).value();
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok.Decode(ids).value(), all);
  EXPECT_EQ(tok.TokenText(0xE9).value(), "\xE9");
}

TEST(TokenizerTest, ByteRoundTripsInvalidUtf8) {
  Tokenizer tok = Tokenizer::Byte();
  for (std::string s : {"\xFF\xFE", "\xE4\xB8", "ab\xF0\x9F\x98", "\xC3", "\x80x\xED\xA0\x80"}) {
    EXPECT_EQ(RoundTrip(tok, s), s);
  }
  EXPECT_EQ(tok.Encode("\xFF\xFE").value(), (std::vector<int>{255, 254}));
}

// ---- char level ----

TEST(TokenizerTest, CharRoundTripsCorpusWithMultiByteAndInvalidBytes) {
  Tokenizer tok = Tokenizer::CharFromCorpus(kMixedCorpus).value();
  EXPECT_EQ(tok.kind(), TokenizerKind::kChar);
  EXPECT_EQ(RoundTrip(tok, kMixedCorpus), kMixedCorpus);
  // One id per character: é, 中 and the emoji are single tokens.
  EXPECT_EQ(tok.Encode("\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80").value().size(), 3u);
  // A truncated sequence is one token per byte.
  EXPECT_EQ(tok.Encode("\xE4\xB8").value().size(), 2u);
}

TEST(TokenizerTest, CharTreatsMalformedSequencesAsSingleBytes) {
  // Surrogate, overlong, beyond U+10FFFF, stray continuation byte: none is a
  // character, so each byte is its own symbol and still round-trips.
  for (std::string s : {"\xED\xA0\x80", "\xC0\xAF", "\xF4\x90\x81\x82", "\x80"}) {
    Tokenizer tok = Tokenizer::CharFromCorpus(s).value();
    EXPECT_EQ(tok.vocab_size(), static_cast<int64_t>(s.size())) << absl::CHexEscape(s);
    EXPECT_EQ(RoundTrip(tok, s), s);
  }
  // The largest code point is one character.
  EXPECT_EQ(Tokenizer::CharFromCorpus("\xF4\x8F\xBF\xBF").value().vocab_size(), 1);
}

TEST(TokenizerTest, CharVocabIsSortedAndDeduplicated) {
  Tokenizer tok = Tokenizer::CharFromCorpus("banana \xE4\xB8\xAD\xC3\xA9\xC3\xA9\xFF\xFF").value();
  EXPECT_EQ(Symbols(tok), (std::vector<std::string>{" ", "a", "b", "n", "\xC3\xA9", "\xE4\xB8\xAD", "\xFF"}));
}

TEST(TokenizerTest, CharEmptyCorpusFails) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::CharFromCorpus("");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(tok.status(), "empty corpus"));
}

TEST(TokenizerTest, CharUnknownCharacterErrorNamesIt) {
  Tokenizer tok = Tokenizer::CharFromCorpus("hello").value();
  absl::StatusOr<std::vector<int>> ids = tok.Encode("hell\xC3\xA9");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ids.status().message(), "character '\xC3\xA9' (U+00E9) at byte 4 is not in the vocabulary");
  EXPECT_TRUE(HasSubstr(tok.Encode("h\xF0\x9F\x98\x80").status(), "(U+1F600) at byte 1"));
}

TEST(TokenizerTest, CharUnknownInvalidByteErrorNamesIt) {
  Tokenizer tok = Tokenizer::CharFromCorpus("hello").value();
  EXPECT_TRUE(HasSubstr(tok.Encode("he\xFF").status(), "byte 0xFF (not valid UTF-8) at byte 2"));
}

TEST(TokenizerTest, CharAddUnkMapsUnknownCharactersToUnk) {
  Tokenizer tok = Tokenizer::CharFromCorpus("ab", /*add_unk=*/true).value();
  // "<unk>" comes last, so character ids are those without add_unk.
  EXPECT_EQ(Symbols(tok), (std::vector<std::string>{"a", "b", "<unk>"}));
  EXPECT_EQ(tok.Encode("a\xC3\xA9"
                       "b\xFF")
                .value(),
            (std::vector<int>{0, 2, 1, 2}));
  EXPECT_EQ(tok.Decode({0, 2, 1}).value(), "a<unk>b");
}

// ---- word level ----

TEST(TokenizerTest, WordEncodeEmitsEosPerNewline) {
  Tokenizer tok = Words({"<eos>", "the", "cat", "sat", "<unk>"});
  EXPECT_EQ(tok.kind(), TokenizerKind::kWord);
  // Runs of spaces and tabs separate words; every newline, also of an empty
  // line and of CRLF, is one <eos>.
  EXPECT_EQ(tok.Encode("  the\tcat  sat\n\nthe cat\r\n").value(), (std::vector<int>{1, 2, 3, 0, 0, 1, 2, 0}));
  EXPECT_EQ(tok.Encode("the").value(), (std::vector<int>{1}));
}

TEST(TokenizerTest, WordDecodeJoinsWithSpacesAndEosAsNewline) {
  Tokenizer tok = Words({"<eos>", "the", "cat", "sat"});
  EXPECT_EQ(tok.Decode({1, 2, 0, 3, 1, 0, 0, 2}).value(), "the cat\nsat the\n\ncat");
  EXPECT_EQ(RoundTrip(tok, "the cat\nsat the\n\ncat"), "the cat\nsat the\n\ncat");
  EXPECT_EQ(tok.TokenText(0).value(), "<eos>");
}

TEST(TokenizerTest, WordUnknownMapsToUnk) {
  Tokenizer tok = Words({"<eos>", "<unk>", "the", "cat"});
  EXPECT_EQ(tok.Encode("the dog\n").value(), (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(tok.Decode({2, 1, 0}).value(), "the <unk>\n");
}

TEST(TokenizerTest, WordUnknownWithoutUnkNamesTheWord) {
  Tokenizer tok = Words({"the", "cat"});
  absl::StatusOr<std::vector<int>> ids = tok.Encode("the  dog");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ids.status().message(), "word 'dog' at byte 5 is not in the vocabulary");
}

TEST(TokenizerTest, WordWithoutEosTreatsNewlineAsSpace) {
  Tokenizer tok = Words({"the", "cat"});
  EXPECT_EQ(tok.Encode("the\ncat\n").value(), (std::vector<int>{0, 1}));
}

TEST(TokenizerTest, WordSplitsOnUnicodeWhitespaceLikePython) {
  // U+00A0 (no-break space) and U+3000 separate words in Python's str.split().
  Tokenizer tok = Words({"a", "b", "c", "\xC3\xA9"});
  EXPECT_EQ(tok.Encode("a\xC2\xA0"
                       "b\xE3\x80\x80\xC3\xA9")
                .value(),
            (std::vector<int>{0, 1, 3}));
}

TEST(TokenizerTest, WordFromVocabFileKeepsLineOrder) {
  const std::string path = WriteFile("vocab.txt", "<eos>\r\nthe\ncaf\xC3\xA9\n<unk>\n");
  Tokenizer tok = Tokenizer::WordFromVocabFile(path).value();
  EXPECT_EQ(Symbols(tok), (std::vector<std::string>{"<eos>", "the", "caf\xC3\xA9", "<unk>"}));
  EXPECT_EQ(tok.Encode("the caf\xC3\xA9 x\n").value(), (std::vector<int>{1, 2, 3, 0}));
  std::remove(path.c_str());
}

TEST(TokenizerTest, WordFromVocabFileMissingFails) {
  absl::StatusOr<Tokenizer> tok = Tokenizer::WordFromVocabFile(::testing::TempDir() + "/no/such/vocab.txt");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(HasSubstr(tok.status(), "no/such/vocab.txt"));
}

TEST(TokenizerTest, WordFromVocabFileEmptyFails) {
  const std::string path = WriteFile("empty.txt", "");
  absl::StatusOr<Tokenizer> tok = Tokenizer::WordFromVocabFile(path);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(tok.status(), "is empty"));
  std::remove(path.c_str());
}

TEST(TokenizerTest, WordFromVocabFileDuplicateNamesTheLines) {
  const std::string path = WriteFile("dup.txt", "a\nthe\nb\nthe\n");
  absl::StatusOr<Tokenizer> tok = Tokenizer::WordFromVocabFile(path);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(tok.status(), "line 4 duplicates line 2 ('the')"));
  std::remove(path.c_str());
}

TEST(TokenizerTest, WordFromVocabFileBlankLineFails) {
  const std::string path = WriteFile("blank.txt", "a\n\nb\n");
  EXPECT_TRUE(HasSubstr(Tokenizer::WordFromVocabFile(path).status(), "line 2 is empty"));
  std::remove(path.c_str());
}

TEST(TokenizerTest, WordFromSymbolsRejectsUnencodableWords) {
  EXPECT_TRUE(HasSubstr(Tokenizer::WordFromSymbols({}).status(), "no symbols"));
  EXPECT_TRUE(HasSubstr(Tokenizer::WordFromSymbols({"a", ""}).status(), "symbols[1] is empty"));
  EXPECT_TRUE(HasSubstr(Tokenizer::WordFromSymbols({"a b"}).status(), "symbols[0] contains whitespace"));
}

// ---- JSON ----

TEST(TokenizerTest, JsonRoundTripByte) {
  Tokenizer tok = Tokenizer::Byte();
  EXPECT_EQ(tok.ToJson(), R"({"type":"byte"})");
  Tokenizer back = Tokenizer::FromJson(tok.ToJson()).value();
  EXPECT_EQ(back.kind(), TokenizerKind::kByte);
  EXPECT_EQ(back.vocab_size(), 256);
  EXPECT_EQ(RoundTrip(back, "\xFF\xFE"), "\xFF\xFE");
}

TEST(TokenizerTest, JsonRoundTripCharWithInvalidUtf8Symbols) {
  Tokenizer tok = Tokenizer::CharFromCorpus(kMixedCorpus, /*add_unk=*/true).value();
  const std::string json = tok.ToJson();
  // Symbols that are not UTF-8 are stored as byte lists.
  EXPECT_NE(json.find("[255]"), std::string::npos) << json;
  EXPECT_NE(json.find("[228]"), std::string::npos) << json;
  Tokenizer back = Tokenizer::FromJson(json).value();
  EXPECT_EQ(back.kind(), TokenizerKind::kChar);
  EXPECT_EQ(Symbols(back), Symbols(tok));
  EXPECT_EQ(back.Encode(kMixedCorpus).value(), tok.Encode(kMixedCorpus).value());
  EXPECT_EQ(RoundTrip(back, kMixedCorpus), kMixedCorpus);
  EXPECT_EQ(back.ToJson(), json);
}

TEST(TokenizerTest, JsonCharExactFormat) {
  Tokenizer tok = Tokenizer::CharFromCorpus(
                      "b\xFF"
                      "a\xC3\xA9")
                      .value();
  EXPECT_EQ(tok.ToJson(), "{\"type\":\"char\",\"symbols\":[\"a\",\"b\",\"\xC3\xA9\",[255]]}");
}

TEST(TokenizerTest, JsonRoundTripWord) {
  Tokenizer tok = Words({"<eos>", "<unk>", "the", "caf\xC3\xA9", "bad\xFF"});
  const std::string json = tok.ToJson();
  EXPECT_NE(json.find("[98,97,100,255]"), std::string::npos) << json;
  Tokenizer back = Tokenizer::FromJson(json).value();
  EXPECT_EQ(back.kind(), TokenizerKind::kWord);
  EXPECT_EQ(Symbols(back), Symbols(tok));
  EXPECT_EQ(back.Encode("the caf\xC3\xA9 dog\n").value(), (std::vector<int>{2, 3, 1, 0}));
}

TEST(TokenizerTest, FromJsonAcceptsPythonStyleFormatting) {
  // json.dumps(..., indent=2): keys in another order, \u escapes (a
  // surrogate pair for the emoji).
  Tokenizer tok = Tokenizer::FromJson(
                      "{\n  \"symbols\": [\"\\u00e9\", \"\\ud83d\\ude00\", [200]],\n"
                      "  \"type\": \"char\"\n}")
                      .value();
  EXPECT_EQ(Symbols(tok), (std::vector<std::string>{"\xC3\xA9", "\xF0\x9F\x98\x80", "\xC8"}));
}

TEST(TokenizerTest, FromJsonRejectsInvalidJson) {
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson("{\"type\": ").status(), "not valid JSON"));
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson("[1, 2]").status(), "must be a JSON object"));
}

TEST(TokenizerTest, FromJsonRejectsUnknownType) {
  absl::Status s = Tokenizer::FromJson(R"({"type": "bpe", "symbols": ["a"]})").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(s, "\"type\" must be \"byte\", \"char\" or \"word\", got \"bpe\""));
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"symbols": ["a"]})").status(), "missing \"type\""));
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": 3})").status(), "got 3"));
}

TEST(TokenizerTest, FromJsonRejectsUnknownKey) {
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": "byte", "vocab": 1})").status(), "unknown key \"vocab\""));
}

TEST(TokenizerTest, FromJsonRejectsSymbolsForByte) {
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": "byte", "symbols": ["a"]})").status(),
                        "byte tokenizer takes no \"symbols\""));
}

TEST(TokenizerTest, FromJsonRejectsMissingSymbols) {
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": "char"})").status(), "a char tokenizer needs \"symbols\""));
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": "word"})").status(), "a word tokenizer needs \"symbols\""));
  EXPECT_TRUE(
      HasSubstr(Tokenizer::FromJson(R"({"type": "word", "symbols": "abc"})").status(), "\"symbols\" must be a list"));
}

TEST(TokenizerTest, FromJsonRejectsEmptySymbols) {
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": "char", "symbols": []})").status(), "no symbols"));
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": "word", "symbols": []})").status(), "no symbols"));
}

TEST(TokenizerTest, FromJsonRejectsDuplicatesNamingTheIndex) {
  absl::Status s = Tokenizer::FromJson(R"({"type": "word", "symbols": ["a", "b", "a"]})").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(s, "symbols[2] duplicates symbols[0] ('a')"));
  // The same symbol written as a string and as a byte list is also a duplicate.
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": "char", "symbols": ["A", [65]]})").status(),
                        "symbols[1] duplicates symbols[0]"));
}

TEST(TokenizerTest, FromJsonRejectsCharSymbolThatIsNotOneCharacter) {
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": "char", "symbols": ["a", "ab"]})").status(),
                        "symbols[1] must be one character"));
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": "char", "symbols": [""]})").status(), "symbols[0] is empty"));
  // Two bytes that are not one UTF-8 sequence.
  EXPECT_TRUE(HasSubstr(Tokenizer::FromJson(R"({"type": "char", "symbols": [[255, 254]]})").status(),
                        "symbols[0] must be one character"));
  // "<unk>" is the one multi-character symbol a char vocab may hold.
  EXPECT_TRUE(Tokenizer::FromJson(R"({"type": "char", "symbols": ["a", "<unk>"]})").ok());
}

TEST(TokenizerTest, FromJsonRejectsNonStringNonByteListEntries) {
  for (const char* entry : {"3", "null", "true", "{}", "[]", "[256]", "[-1]", "[1.5]", "[\"a\"]", "[[1]]"}) {
    absl::Status s = Tokenizer::FromJson(absl::StrCat(R"({"type": "word", "symbols": ["a", )", entry, "]}")).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << entry;
    EXPECT_TRUE(HasSubstr(s, "symbols[1] must be a string or a list of byte values (0-255)")) << entry;
  }
}

// ---- ids ----

TEST(TokenizerTest, DecodeOutOfRangeIdNamesIdAndRange) {
  absl::StatusOr<std::string> text = Tokenizer::Byte().Decode({65, 256});
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), "token id 256 is out of range [0, 256) (at index 1)");
  EXPECT_TRUE(HasSubstr(Words({"a", "b"}).Decode({-1}).status(), "token id -1 is out of range [0, 2)"));
}

TEST(TokenizerTest, TokenTextOutOfRangeFails) {
  Tokenizer tok = Words({"a", "b"});
  EXPECT_EQ(tok.TokenText(1).value(), "b");
  EXPECT_EQ(tok.TokenText(2).status().message(), "token id 2 is out of range [0, 2)");
}

TEST(TokenizerTest, CopiesAreIndependentValues) {
  Tokenizer a = Words({"<eos>", "x"});
  Tokenizer b = a;
  a = Tokenizer::Byte();
  EXPECT_EQ(b.kind(), TokenizerKind::kWord);
  EXPECT_EQ(b.Encode("x\n").value(), (std::vector<int>{1, 0}));
}

// What a generation streams token by token is what Decode writes for the
// whole: at word level, words joined by spaces and <eos> as a newline.
TEST(TokenizerTest, AppendedTextsMakeDecodesText) {
  const Tokenizer words = *Tokenizer::WordFromSymbols({"the", "cat", "<eos>", "sat", "<unk>"});
  const Tokenizer chars = *Tokenizer::CharFromCorpus("ab c\n");
  for (const Tokenizer* tok : {&words, &chars}) {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<int> ids(static_cast<size_t>(rng() % 12));
      for (int& id : ids) id = static_cast<int>(rng() % static_cast<unsigned>(tok->vocab_size()));
      std::string streamed;
      bool after_word = false;
      for (int id : ids) streamed += *tok->AppendedText(id, &after_word);
      EXPECT_EQ(streamed, *tok->Decode(ids));
      EXPECT_EQ(after_word, !ids.empty() && tok->EndsAfterWord(ids.back()));
    }
  }
  bool after_word = true;
  EXPECT_EQ(*words.AppendedText(1, &after_word), " cat");
  EXPECT_EQ(*words.AppendedText(2, &after_word), "\n");
  EXPECT_FALSE(after_word);
  EXPECT_FALSE(words.AppendedText(9, &after_word).ok());
}

// The text order walks every symbol once, sorted by bytes, each with the
// prefix it shares with the one before.
TEST(TokenizerTest, TextOrderSortsTheSymbolsAndCountsSharedPrefixes) {
  const Tokenizer words = *Tokenizer::WordFromSymbols({"cat", "<eos>", "ca", "b", "cats", "\xc3\xa9"});
  std::vector<std::string> seen;
  for (int id : words.ids_in_text_order()) seen.push_back(words.symbols()[static_cast<size_t>(id)]);
  EXPECT_EQ(seen, (std::vector<std::string>{"b", "ca", "cat", "cats", "\xc3\xa9"})) << "<eos> is left out";
  EXPECT_EQ(words.shared_prefix(), (std::vector<int>{0, 0, 2, 3, 0}));
  EXPECT_EQ(Tokenizer::Byte().ids_in_text_order().size(), 256u);
}

}  // namespace
}  // namespace txl
