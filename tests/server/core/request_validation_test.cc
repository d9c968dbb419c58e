// Request validation owns the checks of a client's input (issue 14): the
// ones the scheduler used to repeat are here, with the messages clients see.
#include "server/core/request_validation.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/sampling/grammar.h"

namespace txl {
namespace {

RequestValidator Validator() {
  static const Tokenizer* tokenizer = new Tokenizer(Tokenizer::Byte());
  return RequestValidator(RequestLimits{}, *tokenizer);
}

TEST(RequestValidationTest, ScoreNeedsAtLeastOneToken) {
  v1::ScoreRequest req;
  auto args = Validator().Score(req, nullptr);
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(args.status().message(), "input: must hold at least one token");
  req.mutable_input()->set_text("a");
  EXPECT_TRUE(Validator().Score(req, nullptr).ok());
}

TEST(RequestValidationTest, AGenerationNeedsInputOrHistory) {
  GenerateSpec spec;
  absl::Status s = RequestValidator::Continuation(spec, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "input: empty, and the session has no history to continue from");
  EXPECT_TRUE(RequestValidator::Continuation(spec, 5).ok());  // continues the session
  spec.input = {1};
  EXPECT_TRUE(RequestValidator::Continuation(spec, 0).ok());
}

// max_new_tokens -1 (none) is echo's alone, and needs an input to echo.
TEST(RequestValidationTest, GeneratingNothingIsOnlyForEcho) {
  v1::GenerateRequest req;
  req.mutable_input()->set_text("ab");
  req.set_max_new_tokens(-1);
  auto spec = Validator().Spec(req);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(), "max_new_tokens: -1 (none) is only for echo, which returns the input's log-probs");
  req.set_echo(true);
  spec = Validator().Spec(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_new_tokens, 0);
  EXPECT_TRUE(spec->echo);
  req.clear_input();
  EXPECT_EQ(Validator().Spec(req).status().message(),
            "input: empty, and echo generating nothing has nothing to return");
  req.mutable_input()->set_text("ab");
  req.set_max_new_tokens(-2);
  EXPECT_EQ(Validator().Spec(req).status().message(),
            absl::StrCat("max_new_tokens: must be in [1, ", RequestLimits{}.max_new_tokens,
                         "] (0: 16; -1: none, with echo), got -2"));
}

// n and best_of: 0 means 1 and n; several choices only without a session
// (and its metadata), never with echo, and at most max_n.
TEST(RequestValidationTest, ChoicesAreBoundedAndStateless) {
  v1::GenerateRequest req;
  req.mutable_input()->set_text("ab");
  auto args = Validator().Generate(req, nullptr);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->n, 1);
  EXPECT_EQ(args->best_of, 1);
  req.set_n(3);
  args = Validator().Generate(req, nullptr);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->n, 3);
  EXPECT_EQ(args->best_of, 3);
  req.set_best_of(RequestLimits{}.max_n);
  EXPECT_TRUE(Validator().Generate(req, nullptr).ok());
  req.set_best_of(RequestLimits{}.max_n + 1);
  EXPECT_EQ(Validator().Generate(req, nullptr).status().message(),
            absl::StrCat("best_of: must be in [n, 16] = [3, 16] (0: n), got ", RequestLimits{}.max_n + 1));
  req.set_best_of(2);
  EXPECT_TRUE(absl::StartsWith(Validator().Generate(req, nullptr).status().message(), "best_of: must be in [n"));
  req.set_best_of(0);
  req.set_n(-1);
  EXPECT_EQ(Validator().Generate(req, nullptr).status().message(), "n: must be in [1, 16] (0: 1), got -1");
  req.set_n(2);
  const std::string session = "0123456789abcdef0123456789abcdef";
  auto with_session = Validator().Generate(req, &session);  // the txl-session-id metadata
  EXPECT_TRUE(absl::StartsWith(with_session.status().message(), "n: several choices need a request without a session"))
      << with_session.status();
  req.set_n(1);
  req.set_best_of(2);
  req.set_echo(true);
  EXPECT_EQ(Validator().Generate(req, nullptr).status().message(),
            "best_of: not with echo (ask for the prompt's log-probs alone)");
}

// A grammar is parsed for the request's model: its refusals name the line;
// a vocabulary that cannot begin it is refused; word-level models take them.
TEST(RequestValidationTest, AGrammarIsCheckedAgainstTheModel) {
  v1::GenerateRequest req;
  req.mutable_input()->set_text("ab");
  req.set_grammar("root ::= \"x\" [0-9]+");
  auto spec = Validator().Spec(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_NE(spec->grammar, nullptr);
  req.set_grammar("root ::= \"x\" (");
  EXPECT_EQ(Validator().Spec(req).status().message(), "grammar: line 1, column 14: a group is not closed ())");
  const Tokenizer chars = *Tokenizer::CharFromCorpus("abc xyz");
  req.set_grammar("root ::= \"{\" [a-z]* \"}\"");
  EXPECT_EQ(RequestValidator(RequestLimits{}, chars).Spec(req).status().message(),
            "grammar: no token of the model's vocabulary can begin it (root's first characters are not in it)");
  const Tokenizer words = *Tokenizer::WordFromSymbols({"the", "cat", "<eos>", "<unk>"});
  req.clear_input();
  req.mutable_input()->mutable_tokens()->add_ids(1);
  req.set_grammar("root ::= \"cat\"");
  auto word_spec = RequestValidator(RequestLimits{}, words).Spec(req);
  ASSERT_TRUE(word_spec.ok()) << word_spec.status();
  EXPECT_NE(word_spec->masker, nullptr) << "word-level models take grammars too";
  req.set_grammar("root ::= \"dog\"");
  EXPECT_EQ(RequestValidator(RequestLimits{}, words).Spec(req).status().message(),
            "grammar: no token of the model's vocabulary can begin it (root's first characters are not in it)");
}

// A word-level model's JSON may begin with the space its first word carries
// after a prompt ending in a word (Tokenizer::AppendedText).
TEST(RequestValidationTest, AWordLevelModelsJsonMayBeginWithItsWordsSpace) {
  const Tokenizer words = *Tokenizer::WordFromSymbols({"{", "}", "\"", "a", ":", "<eos>"});
  v1::GenerateRequest req;
  req.mutable_input()->mutable_tokens()->add_ids(3);
  req.mutable_response_format()->set_type(v1::ResponseFormat::TYPE_JSON_OBJECT);
  auto spec = RequestValidator(RequestLimits{}, words).Spec(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const char* text : {"{}", " { }", R"( { " a " : " a " })"}) {
    GrammarState state(spec->grammar);
    EXPECT_TRUE(state.Advance(text) && state.Complete()) << text;
  }
  GrammarState twice(spec->grammar);
  EXPECT_FALSE(twice.Advance("  {")) << "one blank, not two";
}

// With the model's GrammarCache, calls that send the same grammar share its
// masker (its masks are walked once for all of them).
TEST(RequestValidationTest, CallsSendingTheSameGrammarShareItsMasker) {
  const Tokenizer chars = *Tokenizer::CharFromCorpus("abc xyz");
  GrammarCache cache(chars);
  v1::GenerateRequest req;
  req.mutable_input()->set_text("ab");
  req.set_grammar("root ::= \"x\" [a-c]+");
  auto one = RequestValidator(RequestLimits{}, chars, &cache).Spec(req);
  auto two = RequestValidator(RequestLimits{}, chars, &cache).Spec(req);
  auto alone = RequestValidator(RequestLimits{}, chars).Spec(req);
  ASSERT_TRUE(one.ok() && two.ok() && alone.ok());
  EXPECT_EQ(one->masker, two->masker);
  EXPECT_NE(one->masker, alone->masker);
  const Tokenizer other = *Tokenizer::CharFromCorpus("abc xyz");  // a cache is for its own tokenizer only
  auto elsewhere = RequestValidator(RequestLimits{}, other, &cache).Spec(req);
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_EQ(&elsewhere->masker->tokenizer(), &other);
}

// response_format: written as a grammar (json_schema.h), checked as one
// against the model; not beside a grammar; each refusal names its field.
TEST(RequestValidationTest, AResponseFormatIsWrittenAsAGrammarAndChecked) {
  v1::GenerateRequest req;
  req.mutable_input()->set_text("ab");
  req.mutable_response_format()->set_type(v1::ResponseFormat::TYPE_JSON_OBJECT);
  auto spec = Validator().Spec(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_NE(spec->grammar, nullptr);
  GrammarState object(spec->grammar);
  EXPECT_TRUE(object.Advance(R"({"a": [1, true]})") && object.Complete());
  req.mutable_response_format()->set_type(v1::ResponseFormat::TYPE_JSON_SCHEMA);
  req.mutable_response_format()->set_json_schema(R"({"type": "array", "items": {"type": "integer"}})");
  spec = Validator().Spec(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  GrammarState array(spec->grammar);
  EXPECT_TRUE(array.Advance("[1, 2]") && array.Complete());
  EXPECT_FALSE(GrammarState(spec->grammar).Allows("{"));
  auto refusal = [&](const v1::GenerateRequest& r, const Tokenizer* tokenizer = nullptr) {
    auto s = tokenizer ? RequestValidator(RequestLimits{}, *tokenizer).Spec(r) : Validator().Spec(r);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  };
  req.mutable_response_format()->set_json_schema(R"({"type": "integer", "minimum": 0})");
  EXPECT_EQ(refusal(req), "response_format.json_schema: the schema: 'minimum' is not supported");
  // A schema within its own bounds whose grammar passes the grammar's rule limit: named in its terms.
  std::string five = R"({"properties": {)";
  for (int i = 0; i < 5; ++i)
    five += absl::StrCat(i ? "," : "", "\"p", i, "\": {\"type\": \"string\", \"maxLength\": 256}");
  req.mutable_response_format()->set_json_schema(five + "}}");
  EXPECT_EQ(refusal(req),
            "response_format.json_schema: the schema is too large to follow (its grammar has more than 1024 rules "
            "(groups and repetitions count))");
  req.mutable_response_format()->clear_json_schema();
  EXPECT_EQ(refusal(req), "response_format.json_schema: required");
  req.mutable_response_format()->set_type(v1::ResponseFormat::TYPE_JSON_OBJECT);
  req.mutable_response_format()->set_json_schema("{}");
  EXPECT_EQ(refusal(req), "response_format.json_schema: only with type TYPE_JSON_SCHEMA");
  req.mutable_response_format()->clear_json_schema();
  req.set_grammar("root ::= \"x\"");
  EXPECT_EQ(refusal(req), "response_format: give it or a grammar, not both (it is written as one)");
  req.clear_grammar();
  const Tokenizer chars = *Tokenizer::CharFromCorpus("abc xyz");  // no '{'
  EXPECT_EQ(refusal(req, &chars),
            "response_format: no token of the model's vocabulary can begin it (root's first characters are not in it)");
  req.mutable_response_format()->set_type(static_cast<v1::ResponseFormat::Type>(7));
  EXPECT_EQ(refusal(req), "response_format.type: unknown value 7");
}

// A top-k of the vocabulary or more limits nothing; left as it is, it would
// make the model list every word (SamplingPlan::top_n) for a draw that walks
// whole rows anyway.
TEST(RequestValidationTest, ATopKOfTheWholeVocabularyMeansNoLimit) {
  const RequestLimits limits;
  v1::GenerateRequest req;
  req.mutable_input()->set_text("a");
  req.mutable_sampling()->set_temperature(0.5f);
  for (int64_t k : {limits.n_token - 1, limits.n_token, limits.n_token + 1, int64_t{1} << 30}) {
    req.mutable_sampling()->set_top_k(static_cast<int32_t>(k));
    auto spec = Validator().Spec(req);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->sampling.top_k, k < limits.n_token ? k : 0) << k;
  }
}

// Regression: any number of stop sequences, of any length, was accepted, and
// each is matched against the text after every token (unbounded work per
// token from one request).
TEST(RequestValidationTest, StopConditionsAreBounded) {
  const RequestLimits limits;
  v1::GenerateRequest req;
  req.mutable_input()->set_text("a");
  for (int i = 0; i < limits.max_stop_sequences; ++i) req.add_stop_sequences(std::string(1, 'a' + i % 26));
  req.add_stop_sequences(std::string(limits.max_stop_sequence_bytes, 'z'));
  auto spec = Validator().Spec(req);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(), absl::StrCat("stop_sequences: at most ", limits.max_stop_sequences,
                                                  " sequences, got ", limits.max_stop_sequences + 1));
  req.clear_stop_sequences();
  req.add_stop_sequences(std::string(limits.max_stop_sequence_bytes, 'z'));
  EXPECT_TRUE(Validator().Spec(req).ok());
  req.add_stop_sequences(std::string(limits.max_stop_sequence_bytes + 1, 'z'));
  spec = Validator().Spec(req);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(), absl::StrCat("stop_sequences[1]: at most ", limits.max_stop_sequence_bytes,
                                                  " bytes, got ", limits.max_stop_sequence_bytes + 1));
  req.clear_stop_sequences();
  for (int i = 0; i <= limits.max_stop_token_ids; ++i) req.add_stop_token_ids(1);
  spec = Validator().Spec(req);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RequestValidationTest, SamplingIsCheckedOnceHere) {
  v1::GenerateRequest req;
  req.mutable_input()->set_text("a");
  req.mutable_sampling()->set_top_p(1.5f);
  auto args = Validator().Generate(req, nullptr);
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(args.status().message().find("top_p"), std::string::npos);
}

TEST(RequestValidationTest, LabelsUnderTheServersPrefixAreRefused) {
  EXPECT_TRUE(RequestValidator::Labels({{"team", "a"}, {"txl", "b"}, {"xtxl.model", "c"}}).ok());
  absl::Status s = RequestValidator::Labels({{"team", "a"}, {"txl.model", "alpha@1"}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("labels: keys starting with \"txl.\" are the server's, got \"txl.model\""),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace txl
