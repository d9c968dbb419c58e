// The HTTP front end's refusals name the field as the client sent it (issue
// 31): a number beyond a double or a float, and the service's own checks
// (RequestValidator's messages name txl.v1's fields) through ErrorFromStatus.
#include "server/http/openai_json.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "server/core/request_validation.h"
#include "server/sampling/json_schema.h"

namespace txl {
namespace {

struct Refusal {
  bool refused = false;
  HttpError error;
};

Refusal Completion(const std::string& body) {
  Refusal r;
  r.refused = !ParseCompletion(body, "", &r.error).ok();
  return r;
}

TEST(OpenAiJsonTest, ANumberBeyondADoubleNamesItsField) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"prompt": "x", "temperature": 1e999})", "temperature"},
      {R"({"prompt": "x", "seed": -1e999})", "seed"},
      {R"({"prompt": "x", "max_tokens": 1e400})", "max_tokens"},
      {R"({"prompt": [1, 2, 1e999]})", "prompt[2]"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1e999}})",
       "stream_options.include_usage"},
      {R"({"prompt": "x", "extra": [[1e999]]})", "extra[0][0]"},  // a field the server ignores, too
      {R"({"prompt": "x", "a": [{}, {"b": [1, 2e999]}]})", "a[1].b[1]"},
  };
  for (const auto& [body, field] : cases) {
    const Refusal r = Completion(body);
    ASSERT_TRUE(r.refused) << body;
    EXPECT_EQ(r.error.status, 400) << body;
    EXPECT_EQ(r.error.param, field) << body;
    EXPECT_NE(r.error.message.find("'" + field + "' is out of range"), std::string::npos) << r.error.message;
  }
  HttpError e;
  EXPECT_FALSE(ParseCreateSession(R"({"mem_len": 1e999})", &e).ok());
  EXPECT_EQ(e.param, "mem_len");
  EXPECT_FALSE(ParsePosition(R"({"position": -1e999})", true, &e).ok());
  EXPECT_EQ(e.param, "position");
  EXPECT_FALSE(ParseScore(R"({"input": [1e999]})", "s", &e).ok());
  EXPECT_EQ(e.param, "input[0]");
  for (const char* body : {"1e999", "[1, 1e999]"}) {  // not an object: no field to name
    EXPECT_FALSE(ParseBody(body, &e).ok());
    EXPECT_EQ(e.param, "");
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.message, "the request body is out of range: 1e999 is beyond a double (1.8e308)");
  }
}

// OpenAI's logit_bias ({"TOKEN_ID": bias}) and penalties reach the request;
// anything else in them is a 400 naming the field.
TEST(OpenAiJsonTest, LogitBiasAndPenaltiesReachTheRequest) {
  HttpError e;
  auto p = ParseCompletion(
      R"({"prompt": "x", "logit_bias": {"7": -100, "0": 2.5, "007": 1}, "presence_penalty": -2,
          "frequency_penalty": 1.5})",
      "", &e);
  ASSERT_TRUE(p.ok()) << e.message;
  const auto& bias = p->request.sampling().logit_bias();
  EXPECT_EQ(bias.size(), 2u);  // "7" and "007" are the same token
  EXPECT_FLOAT_EQ(bias.at(0), 2.5f);
  EXPECT_TRUE(bias.at(7) == -100.0f || bias.at(7) == 1.0f);
  EXPECT_FLOAT_EQ(p->request.sampling().presence_penalty(), -2.0f);
  EXPECT_FLOAT_EQ(p->request.sampling().frequency_penalty(), 1.5f);
  EXPECT_EQ(p->request.max_new_tokens(), 0);  // absent: the service's default
  const std::pair<std::string, std::string> refused[] = {
      {R"({"prompt": "x", "logit_bias": [1]})", "must be an object of token ids"},
      {R"({"prompt": "x", "logit_bias": {"-1": 1}})", "\"-1\" is not a token id"},
      {R"({"prompt": "x", "logit_bias": {"1e3": 1}})", "\"1e3\" is not a token id"},
      {R"({"prompt": "x", "logit_bias": {"99999999999": 1}})", "is not a token id"},
      {R"({"prompt": "x", "logit_bias": {"3": "high"}})", "the bias of token 3 must be a number"},
      {R"({"prompt": "x", "logit_bias": {"3": 100.5}})", "the bias of token 3 must be in [-100, 100], got 100.5"},
      {R"({"prompt": "x", "presence_penalty": "a"})", "'presence_penalty' must be a number"},
  };
  for (const auto& [body, message] : refused) {
    const Refusal r = Completion(body);
    ASSERT_TRUE(r.refused) << body;
    EXPECT_EQ(r.error.status, 400) << body;
    EXPECT_NE(r.error.message.find(message), std::string::npos) << r.error.message;
    EXPECT_EQ(r.error.param, body.find("logit_bias") != std::string::npos ? "logit_bias" : "presence_penalty");
  }
  // The service's range checks, as the client's fields.
  const HttpError range = ErrorFromStatus(absl::StatusCode::kInvalidArgument,
                                          "sampling.frequency_penalty must be in [-2, 2], got 3", p->fields);
  EXPECT_EQ(range.param, "frequency_penalty");
  EXPECT_EQ(range.message, "frequency_penalty must be in [-2, 2], got 3");
  const HttpError tokens =
      ErrorFromStatus(absl::StatusCode::kInvalidArgument, "max_new_tokens: must be in [1, 5] (0: 5), got 9", p->fields);
  EXPECT_EQ(tokens.message, "max_tokens: must be in [1, 5], got 9");
}

TEST(OpenAiJsonTest, AFloatFieldRefusesADoubleBeyondAFloat) {
  Refusal r = Completion(R"({"prompt": "x", "top_p": 1e300})");
  ASSERT_TRUE(r.refused);
  EXPECT_EQ(r.error.param, "top_p");
  r = Completion(R"({"prompt": "x", "temperature": -3.5e38})");
  ASSERT_TRUE(r.refused);
  EXPECT_EQ(r.error.param, "temperature");
  EXPECT_FALSE(Completion(R"({"prompt": "x", "temperature": 3.4e38})").refused);  // a float holds it
}

// The service's refusal of a parsed request, as the HTTP front end answers it.
HttpError ServiceRefusal(const std::string& body, bool chat) {
  RequestLimits limits;
  limits.max_new_tokens = 50;
  const Tokenizer tokenizer = Tokenizer::Byte();
  const RequestValidator validator(limits, tokenizer);
  HttpError error;
  CompletionParams p;
  if (chat) {
    auto parsed = ParseChat(body, "", &error);
    EXPECT_TRUE(parsed.ok()) << error.message;
    p = parsed->completion;
    p.request.mutable_input()->set_text("rendered");
  } else {
    auto parsed = ParseCompletion(body, "", &error);
    EXPECT_TRUE(parsed.ok()) << error.message;
    p = *parsed;
  }
  auto args = validator.Generate(p.request, nullptr);
  EXPECT_FALSE(args.ok()) << body;
  return ErrorFromStatus(args.status().code(), std::string(args.status().message()), p.fields);
}

TEST(OpenAiJsonTest, TheServicesRefusalsNameTheFieldTheClientSent) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  struct Case {
    std::string body;
    bool chat;
    std::string param, message;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "max_tokens": 51})", false, "max_tokens", "max_tokens: must be in [1, 50], got 51"},
      {"{" + msgs + R"(, "max_tokens": 51})", true, "max_tokens", "max_tokens: must be in [1, 50], got 51"},
      {"{" + msgs + R"(, "max_completion_tokens": 51})", true, "max_completion_tokens",
       "max_completion_tokens: must be in [1, 50], got 51"},
      {R"({"prompt": "x", "temperature": -1})", false, "temperature", "temperature must be >= 0, got -1"},
      {R"({"prompt": "x", "top_p": 2})", false, "top_p", "top_p must be in [0, 1], got 2"},
      {R"({"prompt": "x", "logprobs": 21})", false, "logprobs", "logprobs: must be in [0, 20], got 21"},
      {"{" + msgs + R"(, "logprobs": true, "top_logprobs": 21})", true, "top_logprobs",
       "top_logprobs: must be in [0, 20], got 21"},
      {R"({"prompt": "x", "stop": ["a", ""]})", false, "stop", "stop[1]: must not be empty"},
      {R"({"prompt": [1, 300]})", false, "prompt", "prompt[1]: 300 is outside [0, 256)"},
      {R"({"prompt": "x", "n": 17})", false, "n", "n: must be in [1, 16], got 17"},
      {R"({"prompt": "x", "n": 2, "best_of": 17})", false, "best_of", "best_of: must be in [n, 16] = [2, 16], got 17"},
      {R"({"prompt": "x", "n": 2, "session_id": "0123456789abcdef0123456789abcdef"})", false, "n",
       "n: several choices need a request without a session: a session has one history, and each choice would "
       "continue it differently (fork the session once per choice instead)"},
      {R"({"prompt": "x", "best_of": 3, "echo": true})", false, "best_of",
       "best_of: not with echo (ask for the prompt's log-probs alone)"},
  };
  for (const Case& c : cases) {
    const HttpError e = ServiceRefusal(c.body, c.chat);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.message, c.message) << c.body;
  }
}

// n and best_of reach the request; what OpenAI refuses is a 400 naming the field.
// response_format reaches the request: json_object, and a json_schema's
// schema in the body's own key order. A schema nested very deep or with very
// many keys is refused as it is read (dump() recurses, and an ordered
// object's insertion costs its keys so far): 400 naming the schema's field,
// not a crashed thread.
TEST(OpenAiJsonTest, AResponseFormatReachesTheRequestInItsOwnOrder) {
  HttpError e;
  auto p = ParseCompletion(R"({"prompt": "x", "response_format": {"type": "json_object"}})", "", &e);
  ASSERT_TRUE(p.ok()) << e.message;
  EXPECT_EQ(p->request.response_format().type(), v1::ResponseFormat::TYPE_JSON_OBJECT);
  p = ParseCompletion(R"({"z": {"k2": 0, "k1": 0}, "prompt": "x", "response_format": {"type": "json_schema",
                          "json_schema": {"name": "n", "schema": {"properties": {"zeta": {}, "alpha": {}}}}}})",
                      "", &e);
  ASSERT_TRUE(p.ok()) << e.message;
  EXPECT_EQ(p->request.response_format().type(), v1::ResponseFormat::TYPE_JSON_SCHEMA);
  EXPECT_EQ(p->request.response_format().json_schema(), R"({"properties":{"zeta":{},"alpha":{}}})");
  const std::string deep = std::string(100000, '[') + "1" + std::string(100000, ']');
  const std::string deep_body =
      R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"const": )" + deep +
      "}}}}";
  Refusal r = Completion(deep_body);
  ASSERT_TRUE(r.refused);
  EXPECT_EQ(r.error.param, "response_format.json_schema.schema");
  EXPECT_NE(r.error.message.find("nests deeper than 128"), std::string::npos) << r.error.message;
  std::string keys = R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {)";
  for (int i = 0; i <= kMaxSchemaKeys; ++i) absl::StrAppend(&keys, i ? "," : "", "\"k", i, "\": 0");
  r = Completion(keys + "}}}}");
  ASSERT_TRUE(r.refused);
  EXPECT_EQ(r.error.param, "response_format.json_schema.schema");
  EXPECT_NE(r.error.message.find("more than 4096 keys"), std::string::npos) << r.error.message;
  // Keys elsewhere in the body are not read again in order, nor counted.
  std::string junk = R"({"prompt": "x", "junk": {)";
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&junk, i ? "," : "", "\"k", i, "\": 0");
  junk += R"(}, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}})";
  p = ParseCompletion(junk, "", &e);
  ASSERT_TRUE(p.ok()) << e.message;
  EXPECT_EQ(p->request.response_format().json_schema(), R"({"type":"integer"})");
}

TEST(OpenAiJsonTest, NAndBestOfReachTheRequest) {
  HttpError e;
  auto p = ParseCompletion(R"({"prompt": "x", "n": 2, "best_of": 5})", "", &e);
  ASSERT_TRUE(p.ok()) << e.message;
  EXPECT_EQ(p->request.n(), 2);
  EXPECT_EQ(p->request.best_of(), 5);
  p = ParseCompletion(R"({"prompt": "x", "n": 3, "stream": true})", "", &e);
  ASSERT_TRUE(p.ok()) << e.message;
  EXPECT_EQ(p->request.n(), 3);
  EXPECT_EQ(p->request.best_of(), 0) << "absent: the service's n";
  const std::pair<std::string, std::string> refused[] = {
      {R"({"prompt": "x", "n": 0})", "n"},
      {R"({"prompt": "x", "n": 3, "best_of": 2})", "best_of"},
      {R"({"prompt": "x", "n": 2, "best_of": 3, "stream": true})", "best_of"},  // the best are known at the end
  };
  for (const auto& [body, field] : refused) {
    const Refusal r = Completion(body);
    ASSERT_TRUE(r.refused) << body;
    EXPECT_EQ(r.error.param, field) << body;
  }
  EXPECT_FALSE(Completion(R"({"prompt": "x", "n": 2, "best_of": 2, "stream": true})").refused);
  EXPECT_FALSE(ParseChat(R"({"messages": [{"role": "user", "content": "hi"}], "best_of": 2})", "", &e).ok());
  EXPECT_EQ(e.param, "best_of");
  EXPECT_TRUE(ParseChat(R"({"messages": [{"role": "user", "content": "hi"}], "best_of": 1})", "", &e).ok())
      << "1, the default some clients send, asks for nothing";
  auto chat = ParseChat(R"({"messages": [{"role": "user", "content": "hi"}], "n": 2})", "", &e);
  ASSERT_TRUE(chat.ok()) << e.message;
  EXPECT_EQ(chat->completion.request.n(), 2);
}

// Each choice's responses gather under its index; the usage is the call's.
TEST(OpenAiJsonTest, ChoicesRenderByIndex) {
  CompletionResult r;
  auto response = [](int index, const std::string& text, v1::FinishReason finish) {
    v1::GenerateResponse g;
    g.set_index(index);
    g.set_text(text);
    g.add_tokens()->set_text(text);
    g.set_finish_reason(finish);
    return g;
  };
  r.Add(response(1, "b", v1::FINISH_REASON_UNSPECIFIED));
  r.Add(response(0, "a", v1::FINISH_REASON_UNSPECIFIED));
  r.Add(response(1, "B", v1::FINISH_REASON_STOP_SEQUENCE));
  v1::GenerateResponse last = response(0, "A", v1::FINISH_REASON_LENGTH);
  last.mutable_usage()->set_input_tokens(4);
  last.mutable_usage()->set_generated_tokens(9);
  r.Add(last);
  const CompletionId id{"cmpl-1", 1, "m"};
  const nlohmann::json body = nlohmann::json::parse(CompletionBody(id, r, /*logprobs=*/true));
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["text"], "aA");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["text"], "bB");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][1]["logprobs"]["text_offset"], nlohmann::json::array({0, 1})) << "each choice's own";
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(body["usage"]["total_tokens"], 13);
  const nlohmann::json chat = nlohmann::json::parse(ChatBody(id, r, false));
  EXPECT_EQ(chat["choices"][1]["message"]["content"], "bB");
  const std::string chunk = ChatChunk(id, response(1, "z", v1::FINISH_REASON_UNSPECIFIED), false, true, "");
  const nlohmann::json event = nlohmann::json::parse(chunk.substr(6));  // after "data: "
  EXPECT_EQ(event["choices"][0]["index"], 1);
  EXPECT_EQ(event["choices"][0]["delta"]["role"], "assistant");
}

TEST(OpenAiJsonTest, OtherRefusalsKeepTheirMessageAndNameNoField) {
  const HttpError e = ErrorFromStatus(absl::StatusCode::kNotFound, "max_new_tokens: not a refusal of a field");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.param, "");
  EXPECT_EQ(e.message, "max_new_tokens: not a refusal of a field");
  // The session routes' fields are named as on gRPC.
  const HttpError m = ErrorFromStatus(absl::StatusCode::kInvalidArgument, "mem_len: must be in [1, 8], got 9");
  EXPECT_EQ(m.param, "mem_len");
  EXPECT_EQ(m.message, "mem_len: must be in [1, 8], got 9");
}

}  // namespace
}  // namespace txl
