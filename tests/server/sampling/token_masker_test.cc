// TokenMasker and GrammarCache (server/sampling/token_masker.h,
// grammar_cache.h): the masks equal the token-by-token check they replace,
// on byte, character and word vocabularies, in both word contexts, and a
// place already walked is a look-up.
#include "server/sampling/token_masker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "server/sampling/grammar_cache.h"
#include "server/sampling/json_schema.h"

namespace txl {
namespace {

std::shared_ptr<const Grammar> Parsed(const std::string& text) {
  auto g = Grammar::Parse(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

// What GenerateJob did before the masker: every token's text, one by one.
std::vector<bool> OneByOne(const GrammarState& state, const Tokenizer& tok, bool after_word) {
  std::vector<bool> allowed(static_cast<size_t>(tok.vocab_size()));
  for (int id = 0; id < tok.vocab_size(); ++id) {
    bool spaced = after_word;
    const std::string text = *tok.AppendedText(id, &spaced);
    allowed[static_cast<size_t>(id)] = !text.empty() && state.Allows(text);
  }
  return allowed;
}

// A mask's bits as one bool per token of an n-token vocabulary.
std::vector<bool> Bools(const TokenMask& mask, int64_t n) {
  std::vector<bool> out(static_cast<size_t>(n));
  for (int64_t id = 0; id < n; ++id) out[static_cast<size_t>(id)] = mask.bits.contains(id);
  return out;
}

// Words of a small alphabet that JSON needs (and some it refuses), so that
// prefixes are shared and many words are allowed in some places.
Tokenizer RandomWords(int n, uint32_t seed) {
  const std::string alphabet = "ab{}[]\":,0-1.etrunlsfx\\";
  std::mt19937 rng(seed);
  std::set<std::string> words = {"<eos>", "{", "}", "\"", ":", ",", "true", "null", "1", "a"};
  while (static_cast<int>(words.size()) < n) {
    std::string w(1 + rng() % 5, ' ');
    for (char& c : w) c = alphabet[rng() % alphabet.size()];
    words.insert(w);
  }
  return *Tokenizer::WordFromSymbols(std::vector<std::string>(words.begin(), words.end()));
}

// Walks a random valid text through the grammar, token by token, and at each
// place compares the masker's mask with the one-by-one check.
void CompareAlongRandomTexts(const std::shared_ptr<const Grammar>& g, const Tokenizer& tok, int texts, int steps) {
  auto masker = TokenMasker::Create(g, tok);
  std::mt19937 rng(3);
  int compared = 0;
  for (int t = 0; t < texts; ++t) {
    GrammarState state(g);
    bool after_word = t % 2 == 1;  // a prompt ending in a word, or not
    for (int step = 0; step < steps && state.CanContinue(); ++step) {
      std::shared_ptr<const TokenMask> mask = masker->Next(state, after_word);
      const std::vector<bool> want = OneByOne(state, tok, after_word);
      ASSERT_EQ(Bools(*mask, tok.vocab_size()), want) << "text " << t << ", step " << step;
      ASSERT_EQ(mask->count, std::count(want.begin(), want.end(), true));
      ASSERT_FALSE(mask->bits.contains(static_cast<int64_t>(want.size()))) << "past the vocabulary";
      ++compared;
      if (mask->count == 0) break;
      int pick = static_cast<int>(rng() % static_cast<unsigned>(mask->count));
      int id = 0;
      while (!mask->bits.contains(id) || pick-- > 0) ++id;
      ASSERT_TRUE(state.Advance(*tok.AppendedText(id, &after_word)));
    }
  }
  EXPECT_GT(compared, texts);
}

TEST(TokenMaskerTest, WordMasksEqualTheOneByOneCheckInBothWordContexts) {
  const Tokenizer words = RandomWords(3000, 1);
  CompareAlongRandomTexts(Parsed(JsonObjectGrammar()), words, 12, 40);
  CompareAlongRandomTexts(Parsed(R"(root ::= "a" (" " [a-z]+)* "\n")"), words, 6, 20);
}

TEST(TokenMaskerTest, ByteAndCharacterMasksEqualTheOneByOneCheck) {
  const auto g = Parsed(JsonObjectGrammar());
  CompareAlongRandomTexts(g, Tokenizer::Byte(), 6, 60);
  const Tokenizer chars = *Tokenizer::CharFromCorpus("{}[]\":, abc0123456789.-\xc3\xa9\n");
  CompareAlongRandomTexts(g, chars, 6, 60);
}

TEST(TokenMaskerTest, AWordAfterAWordNeedsTheGrammarToTakeItsSpace) {
  const Tokenizer words = *Tokenizer::WordFromSymbols({"a", "b", "<eos>"});
  auto g = Parsed(R"(root ::= "a b\n")");
  auto masker = TokenMasker::Create(g, words);
  GrammarState state(g);
  EXPECT_EQ(Bools(*masker->Next(state, false), 3), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(masker->Next(state, true)->count, 0) << "' a' is not the text's start";
  bool after_word = false;
  ASSERT_TRUE(state.Advance(*words.AppendedText(0, &after_word)));
  EXPECT_EQ(Bools(*masker->Next(state, after_word), 3), (std::vector<bool>{false, true, false}));
  ASSERT_TRUE(state.Advance(*words.AppendedText(1, &after_word)));
  EXPECT_EQ(Bools(*masker->Next(state, after_word), 3), (std::vector<bool>{false, false, true})) << "<eos> is \\n";
}

TEST(TokenMaskerTest, APlaceAlreadyWalkedIsALookUp) {
  const Tokenizer words = RandomWords(500, 2);
  auto g = Parsed(R"(root ::= "\"" [a-z]* "\"")");
  auto masker = TokenMasker::Create(g, words);
  GrammarState state(g);
  ASSERT_TRUE(state.Advance("\""));
  auto first = masker->Next(state, false);
  ASSERT_TRUE(state.Advance("ab"));  // inside the string, the same place
  auto again = masker->Next(state, false);
  EXPECT_EQ(first, again);
  EXPECT_EQ(masker->stats().walks, 1);
  EXPECT_EQ(masker->stats().reused, 1);
  masker->Next(state, true);  // the other word context is a walk of its own
  EXPECT_EQ(masker->stats().walks, 2);
}

TEST(TokenMaskerTest, KeptMasksStayWithinTheirBytes) {
  const Tokenizer bytes = Tokenizer::Byte();
  auto g = Parsed(R"(root ::= [a-z] [a-z] [a-z] [a-z] [a-z] [a-z] "!")");
  TokenMaskerLimits limits;
  limits.max_mask_bytes = 2 * (256 / 8);  // two masks
  auto masker = TokenMasker::Create(g, bytes, limits);
  GrammarState state(g);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(Bools(*masker->Next(state, false), bytes.vocab_size()), OneByOne(state, bytes, false)) << i;
    ASSERT_TRUE(state.Advance("q"));
    EXPECT_LE(masker->stats().mask_bytes, limits.max_mask_bytes);
  }
  EXPECT_EQ(masker->stats().walks, 6);
  EXPECT_GE(masker->stats().masks_dropped, 4);
}

// A grammar whose parse sets remember every byte read (a palindrome's first
// half) meets a new set at every prefix of the vocabulary: past max_states a
// walk steps on without remembering, so its memory stays bounded, and the
// masks are still exact.
TEST(TokenMaskerTest, AWalkPastTheStateLimitStepsOnWithoutRememberingAndStaysExact) {
  const Tokenizer words = RandomWords(2000, 6);
  auto g = Parsed(R"(root ::= s
s ::= "a" s "a" | "b" s "b" | "e" s "e" | "t" s "t" | "." | "1"
)");
  TokenMaskerLimits limits;
  limits.max_states = 40;
  auto masker = TokenMasker::Create(g, words, limits);
  GrammarState state(g);
  bool after_word = false;
  for (const char* next : {"ab", "et", "ta"}) {
    for (bool spaced : {false, true}) {
      EXPECT_EQ(Bools(*masker->Next(state, spaced), words.vocab_size()), OneByOne(state, words, spaced)) << next;
      EXPECT_LE(masker->stats().states, limits.max_states);
    }
    ASSERT_TRUE(state.Advance(next));
  }
  EXPECT_GT(masker->stats().unremembered, 0);
  limits.max_states = 4096;
  limits.max_stack_positions = 30;  // the sets' bytes bound it too
  auto small = TokenMasker::Create(g, words, limits);
  GrammarState fresh(g);
  EXPECT_EQ(Bools(*small->Next(fresh, after_word), words.vocab_size()), OneByOne(fresh, words, after_word));
  EXPECT_GT(small->stats().unremembered, 0);
}

TEST(GrammarCacheTest, TheSameTextSharesOneMaskerAndRefusalsAreNotKept) {
  const Tokenizer words = RandomWords(200, 4);
  GrammarCacheConfig config;
  config.capacity = 2;
  GrammarCache cache(words, config);
  auto a = cache.Get(R"(root ::= "a")");
  auto again = cache.Get(R"(root ::= "a")");
  ASSERT_TRUE(a.ok() && again.ok());
  EXPECT_EQ(a->masker, again->masker);
  EXPECT_EQ(a->grammar, again->grammar);
  auto none = cache.Get(R"(root ::= "zzz")");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no token of the model's vocabulary can begin it"), std::string::npos)
      << none.status();
  EXPECT_EQ(cache.Get(R"(root ::= "")").status().message(), "grammar: root matches only the empty text");
  // A word context makes a text beginnable: " 1" begins " 1"'s grammar only after a word.
  EXPECT_TRUE(cache.Get(R"(root ::= " 1")").ok());
  ASSERT_TRUE(cache.Get(R"(root ::= "{")").ok());  // the third kept: "a" is out
  auto later = cache.Get(R"(root ::= "a")");
  ASSERT_TRUE(later.ok());
  EXPECT_NE(later->masker, a->masker);
}

}  // namespace
}  // namespace txl
