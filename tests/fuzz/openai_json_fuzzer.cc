// libFuzzer target: the HTTP front end's request bodies (server/http/openai_json.h), which
// the OpenAI-style routes parse before any gRPC call: /v1/completions (ParseCompletion),
// /v1/chat/completions (ParseChat), the sessions' create and fork (ParseCreateSession), fork and
// rewind (ParsePosition), score (ParseScore), and ParseBody under them all.
//
// Checked beyond "no crash, no sanitizer report":
//   - no exception escapes (the transport would answer 500 where docs/HTTP.md promises 400);
//   - a refusal is an INVALID_ARGUMENT status whose message is the HttpError's, non-empty; the
//     error is 400 `invalid_argument` (a model's name is the service's to find, not the parser's); its
//     param is one of the fields the route reads, named in the message and present in the body
//     (but for a required field that is missing), or, for a number beyond a double (which ends
//     the parse), the path to it ("prompt[2]"), in a body that does not parse; without a param
//     it is about the body as a whole; ErrorBody turns it into JSON that reads back as the same
//     error;
//   - a body that is not a JSON object is refused (ParseCreateSession and ParsePosition also
//     take an empty body), and a JSON object's refusal names a param;
//   - what is accepted is what the body says, within the documented ranges: max_tokens (or
//     max_completion_tokens) in [1, 2^31 - 1], default 16, or 0 with a completion's echo (the
//     service's -1); echo the body's, and never a chat's; n and best_of (>= n, at most 1 on a chat, never above n when
//     streamed) and the grammar the body's; seed, mem_len, idle_ttl_seconds and position >= 0; logprobs and
//     top_logprobs in [0, 2^31 - 1]; temperature and top_p the body's, within a float's range (default 1); the stop
//     strings; stream_options only with stream; the refused options absent; the session id the body's, else the
//     header's; the prompt, messages (roles system, user or assistant, content the text parts joined), score input
//     (token ids in [0, 2^31 - 1]) and labels as given;
//   - parsing the same body twice gives the same outcome.
// A broken property calls __builtin_trap(), which libFuzzer reports as a crash.
//
// Input: byte 0 picks the parser (% 7: completion, chat, body, score, create session, position,
// required position) and, from its next bit, whether a txl-session-id header is sent; the rest is
// the body.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "google/protobuf/util/message_differencer.h"
#include "server/http/openai_json.h"

namespace {

using namespace txl;
using json = nlohmann::json;

constexpr char kHeaderSession[] = "0123456789abcdef0123456789abcdef";
constexpr char kPathSession[] = "fedcba9876543210fedcba9876543210";
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "openai_json_fuzzer: property broken: %s\n", what);
    __builtin_trap();
  }
}

enum Parser { kCompletion, kChat, kBody, kScore, kCreateSession, kPosition, kRequiredPosition, kParsers };

// The fields each parser reads: the params a refusal may name.
const std::set<std::string>& ParamsOf(int parser) {
  static const auto* common = new std::set<std::string>{"model",
                                                        "max_tokens",
                                                        "max_completion_tokens",
                                                        "n",
                                                        "seed",
                                                        "temperature",
                                                        "top_p",
                                                        "stop",
                                                        "user",
                                                        "echo",
                                                        "suffix",
                                                        "tools",
                                                        "functions",
                                                        "response_format",
                                                        "response_format.type",
                                                        "response_format.json_schema",
                                                        "response_format.json_schema.schema",
                                                        "best_of",
                                                        "grammar",
                                                        "presence_penalty",
                                                        "frequency_penalty",
                                                        "logit_bias",
                                                        "stream",
                                                        "stream_options",
                                                        "include_usage",
                                                        "session_id",
                                                        "logprobs"};
  static const auto* completion = [] {
    auto* s = new std::set<std::string>(*common);
    s->insert("prompt");
    return s;
  }();
  static const auto* chat = [] {
    auto* s = new std::set<std::string>(*common);
    s->insert({"messages", "top_logprobs"});
    return s;
  }();
  static const auto* none = new std::set<std::string>{};
  static const auto* score = new std::set<std::string>{"input", "commit"};
  static const auto* create = new std::set<std::string>{"mem_len", "idle_ttl_seconds", "labels", "session_id", "model"};
  static const auto* position = new std::set<std::string>{"position"};
  switch (parser) {
    case kCompletion: return *completion;
    case kChat: return *chat;
    case kScore: return *score;
    case kCreateSession: return *create;
    case kPosition:
    case kRequiredPosition: return *position;
    default: return *none;
  }
}

// Fields whose refusal may say they are missing (and the nested include_usage).
bool MayBeAbsent(const std::string& param) {
  return param == "prompt" || param == "messages" || param == "input" || param == "position" ||
         param == "include_usage";
}

bool Blank(const std::string& body) { return body.find_first_not_of(" \t\r\n") == std::string::npos; }

// The body's field, or nullptr when it is absent or null (how every parser reads an option).
const json* Field(const json& doc, const char* name) {
  auto it = doc.find(name);
  return it == doc.end() || it->is_null() ? nullptr : &*it;
}

// An accepted integer field: within [lo, hi] and the body's number.
void CheckInt(const json* v, int64_t got, int64_t lo, int64_t hi, int64_t dflt, const char* what) {
  Check(got >= lo && got <= hi, what);
  if (v == nullptr) {
    Check(got == dflt, what);
    return;
  }
  Check(v->is_number(), what);
  if (v->is_number_unsigned()) {
    Check(static_cast<uint64_t>(got) == v->get<uint64_t>(), what);
  } else if (v->is_number_integer()) {
    Check(got == v->get<int64_t>(), what);
  } else {
    Check(static_cast<double>(got) == v->get<double>(), what);
  }
}

// An accepted number field, as the proto's float holds it.
float FloatField(const json& doc, const char* name, float dflt) {
  const json* v = Field(doc, name);
  if (v == nullptr) return dflt;
  Check(v->is_number(), "a number field holds a number");
  Check(std::fabs(v->get<double>()) <= std::numeric_limits<float>::max(), "a float field holds a float");
  return static_cast<float>(v->get<double>());
}

void CheckRefusal(int parser, const absl::Status& s, const HttpError& e, const json& doc, bool object) {
  Check(!s.ok(), "a refusal is not OK");
  Check(s.code() == absl::StatusCode::kInvalidArgument, "a refusal is INVALID_ARGUMENT");
  Check(!e.message.empty(), "a refusal says why");
  Check(s.message() == e.message, "the status carries the error's message");
  Check(e.status == 400 && e.code == "invalid_argument", "a refusal is 400 invalid_argument");
  if (e.param.empty()) {
    Check(e.message.rfind("the request body ", 0) == 0, "a refusal without a param is about the body");
    Check(!object, "a JSON object's refusal names a param");
  } else if (!object) {  // a number beyond a double, in what parses as an object up to it
    Check(e.message.rfind("'" + e.param + "' is out of range: ", 0) == 0, "an overflow names its path");
    Check(e.param[0] != '[', "the path starts with a field");
  } else {
    Check(object, "a refusal naming a param read a JSON object");
    Check(e.message.find(e.param) != std::string::npos, "the message names the param");
    if (e.param.rfind("messages[", 0) == 0) {
      Check(parser == kChat && doc.contains("messages"), "messages[i] is a chat's");
    } else {
      Check(ParamsOf(parser).count(e.param) == 1, "the param is a field the route reads");
      Check(MayBeAbsent(e.param) || Field(doc, e.param.c_str()) != nullptr, "the param is in the body");
    }
  }
  // What the route sends: JSON, read back as this error (the message where it is UTF-8).
  const json back = json::parse(ErrorBody(e), nullptr, false);
  Check(back.is_object() && back.contains("error") && back["error"].is_object(), "ErrorBody is JSON");
  const json& err = back["error"];
  Check(err.contains("message") && err.contains("type") && err.contains("param") && err.contains("code"),
        "ErrorBody has OpenAI's four fields");
  Check(err.value("type", "") == (e.status == 404 ? "not_found_error" : "invalid_request_error"),
        "ErrorBody's type is the status's");
  Check(err["param"] == (e.param.empty() ? json(nullptr) : json(e.param)), "ErrorBody names the param");
  Check(err["code"] == json(e.code), "ErrorBody carries the code");
  bool utf8 = true;
  try {
    (void)json(e.message).dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception&) {
    utf8 = false;
  }
  if (utf8) Check(err["message"] == json(e.message), "ErrorBody carries the message");
}

// What ParseCommon promises for a completion or a chat.
void CheckCommon(const json& doc, const CompletionParams& p, bool header) {
  const v1::GenerateRequest& r = p.request;
  const json* model = Field(doc, "model");
  Check(model ? model->is_string() && model->get<std::string>() == r.model() : r.model().empty(),
        "the model is the body's, as it is");
  const char* max_field =
      doc.contains("max_completion_tokens") && !doc.contains("max_tokens") ? "max_completion_tokens" : "max_tokens";
  const json* echo = Field(doc, "echo");
  if (echo) Check(echo->is_boolean(), "'echo' a boolean");
  Check(p.echo == (echo != nullptr && *echo == true) && r.echo() == p.echo, "echo is the body's");
  if (const json* max = Field(doc, max_field)) {
    if (p.echo && r.max_new_tokens() == -1) {
      Check(max->is_number() && max->get<double>() == 0, "max_tokens 0 with echo: none (-1)");
    } else {
      CheckInt(max, r.max_new_tokens(), 1, kInt32Max, 0, "max_tokens in [1, 2^31 - 1]");
    }
  } else {
    Check(r.max_new_tokens() == 0, "no max_tokens: 0, the service's default");
  }
  CheckInt(Field(doc, "n"), r.n(), 1, kInt32Max, 1, "n in [1, 2^31 - 1], the body's (default 1)");
  Check(r.sampling().seed() <= static_cast<uint64_t>(kInt64Max), "seed >= 0");
  CheckInt(Field(doc, "seed"), static_cast<int64_t>(r.sampling().seed()), 0, kInt64Max, 0, "seed is the body's");
  Check(r.sampling().temperature() == FloatField(doc, "temperature", 1.0f), "temperature is the body's, default 1");
  Check(r.sampling().top_p() == FloatField(doc, "top_p", 1.0f), "top_p is the body's, default 1");
  Check(r.sampling().top_k() == 0, "no top_k");
  Check(r.stop_token_ids_size() == 0, "no stop token ids");
  const json* stop = Field(doc, "stop");
  if (stop == nullptr) {
    Check(r.stop_sequences_size() == 0, "no stop without 'stop'");
  } else if (stop->is_string()) {
    Check(r.stop_sequences_size() == 1 && r.stop_sequences(0) == stop->get<std::string>(), "'stop' a string");
  } else {
    Check(stop->is_array() && static_cast<size_t>(r.stop_sequences_size()) == stop->size(), "'stop' an array");
    for (size_t i = 0; i < stop->size(); ++i) {
      Check((*stop)[i].is_string() && r.stop_sequences(static_cast<int>(i)) == (*stop)[i].get<std::string>(),
            "each stop string as given");
    }
  }
  if (const json* user = Field(doc, "user")) Check(user->is_string(), "'user' a string");
  for (const char* refused : {"suffix", "tools", "functions"}) {
    Check(Field(doc, refused) == nullptr, "unsupported options refused");
  }
  const v1::ResponseFormat& format = r.response_format();
  if (const json* fmt = Field(doc, "response_format")) {
    Check(fmt->is_object() && fmt->contains("type") && (*fmt)["type"].is_string(), "response_format has a type");
    const std::string type = (*fmt)["type"].get<std::string>();
    if (type == "json_schema") {
      Check(format.type() == v1::ResponseFormat::TYPE_JSON_SCHEMA &&
                json::parse(format.json_schema()) == (*fmt)["json_schema"]["schema"],
            "json_schema: the body's schema, as JSON");
    } else {
      Check(type == "text" || type == "json_object", "response_format's type one of three");
      Check(format.json_schema().empty() &&
                (format.type() == v1::ResponseFormat::TYPE_JSON_OBJECT) == (type == "json_object"),
            "text and json_object carry no schema");
    }
  } else {
    Check(format.type() == v1::ResponseFormat::TYPE_TEXT && format.json_schema().empty(), "no response_format: text");
  }
  if (const json* best_of = Field(doc, "best_of")) {
    CheckInt(best_of, r.best_of(), r.n(), kInt32Max, 0, "best_of in [n, 2^31 - 1], the body's");
  } else {
    Check(r.best_of() == 0, "no best_of: 0, the service's n");
  }
  Check(!p.stream || r.best_of() <= r.n(), "best_of above n is never streamed");
  const json* grammar = Field(doc, "grammar");
  Check(grammar ? grammar->is_string() && grammar->get<std::string>() == r.grammar() : r.grammar().empty(),
        "the grammar is the body's, as it is");
  Check(r.sampling().presence_penalty() == FloatField(doc, "presence_penalty", 0.0f), "presence_penalty, default 0");
  Check(r.sampling().frequency_penalty() == FloatField(doc, "frequency_penalty", 0.0f), "frequency_penalty, default 0");
  if (const json* bias = Field(doc, "logit_bias")) {
    Check(bias->is_object() && static_cast<size_t>(r.sampling().logit_bias_size()) <= bias->size(),
          "logit_bias an object, each id once");
    for (const auto& [key, value] : bias->items()) {
      const int token = std::stoi(key);  // a decimal id, or refused
      Check(r.sampling().logit_bias().contains(token) && value.is_number() && value.get<double>() >= -100 &&
                value.get<double>() <= 100,
            "each bias as given, in [-100, 100]");
    }
  } else {
    Check(r.sampling().logit_bias().empty(), "no logit_bias");
  }
  const json* stream = Field(doc, "stream");
  Check(p.stream == (stream != nullptr && *stream == true), "stream is the body's");
  if (stream) Check(stream->is_boolean(), "'stream' a boolean");
  const json* options = Field(doc, "stream_options");
  if (options) Check(options->is_object() && p.stream, "stream_options only with stream");
  const json* usage = options ? Field(*options, "include_usage") : nullptr;
  Check(p.include_usage == (usage != nullptr && *usage == true), "include_usage is the body's");
  if (usage) Check(usage->is_boolean(), "'include_usage' a boolean");
  const json* session = Field(doc, "session_id");
  if (session) {
    Check(session->is_string() && r.session_id() == session->get<std::string>(), "the body's session id");
  } else {
    Check(r.session_id() == (header ? kHeaderSession : ""), "else the header's");
  }
}

void CheckCompletion(const json& doc, const CompletionParams& p, bool header) {
  CheckCommon(doc, p, header);
  const v1::GenerateRequest& r = p.request;
  const json* prompt = Field(doc, "prompt");
  Check(prompt != nullptr, "a prompt is required");
  if (prompt->is_string()) {
    Check(r.input().has_text() && r.input().text() == prompt->get<std::string>(), "a string prompt as given");
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    Check(r.input().has_text() && r.input().text() == (*prompt)[0].get<std::string>(), "[string] as given");
  } else {
    Check(prompt->is_array() && r.input().has_tokens(), "else token ids");
    Check(static_cast<size_t>(r.input().tokens().ids_size()) == prompt->size(), "every token id kept");
    for (size_t i = 0; i < prompt->size(); ++i) {
      CheckInt(&(*prompt)[i], r.input().tokens().ids(static_cast<int>(i)), 0, kInt32Max, 0,
               "token ids in [0, 2^31 - 1], as given");
      Check((*prompt)[i].is_number_integer(), "token ids are integers");
    }
  }
  const json* logprobs = Field(doc, "logprobs");
  Check(p.logprobs == (logprobs != nullptr), "logprobs asked for by a number");
  CheckInt(logprobs, r.logprobs(), 0, kInt32Max, 0, "logprobs in [0, 2^31 - 1]");
}

void CheckChat(const json& doc, const ChatParams& p, bool header) {
  CheckCommon(doc, p.completion, header);
  Check(!p.completion.echo, "a chat has no echo");
  Check(p.completion.request.best_of() <= 1, "a chat's best_of is 1 at most");
  const v1::GenerateRequest& r = p.completion.request;
  Check(!r.has_input(), "the gateway renders the chat's input");
  const json* messages = Field(doc, "messages");
  Check(messages && messages->is_array() && !messages->empty(), "messages: a non-empty array");
  Check(p.messages.size() == messages->size(), "every message kept");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const ChatMessage& got = p.messages[i];
    Check(m.is_object() && m.contains("role") && m["role"].is_string(), "a message has a role");
    const std::string role = m["role"].get<std::string>();
    Check(got.role == (role == "developer" ? "system" : role), "the role as given (developer: system)");
    Check(got.role == "system" || got.role == "user" || got.role == "assistant", "roles system, user, assistant");
    const json content = m.contains("content") ? m["content"] : json(nullptr);
    if (content.is_string()) {
      Check(got.content == content.get<std::string>(), "string content as given");
    } else {
      Check(content.is_array(), "content a string or parts");
      std::string joined;
      for (const json& part : content) {
        Check(part.is_object() && part.contains("type") && part["type"] == "text" && part.contains("text") &&
                  part["text"].is_string(),
              "only text parts");
        joined += part["text"].get<std::string>();
      }
      Check(got.content == joined, "the text parts joined");
    }
  }
  const json* logprobs = Field(doc, "logprobs");
  if (logprobs) Check(logprobs->is_boolean(), "chat logprobs a boolean");
  const bool asked = logprobs && *logprobs == true;
  Check(p.completion.logprobs == asked, "logprobs is the body's");
  const json* top = Field(doc, "top_logprobs");
  if (asked) {
    CheckInt(top, r.logprobs(), 0, kInt32Max, 0, "top_logprobs in [0, 2^31 - 1]");
  } else {
    Check(r.logprobs() == 0, "no alternatives without logprobs");
    if (top) CheckInt(top, 0, 0, 0, 0, "top_logprobs > 0 needs logprobs");
  }
}

void CheckScore(const json& doc, const v1::ScoreRequest& r) {
  Check(r.session_id() == kPathSession, "the route's session");
  const json* input = Field(doc, "input");
  Check(input != nullptr, "input is required");
  if (input->is_string()) {
    Check(r.input().has_text() && r.input().text() == input->get<std::string>(), "string input as given");
  } else {
    Check(input->is_array() && !r.input().has_text(), "else token ids");
    Check(static_cast<size_t>(r.input().tokens().ids_size()) == input->size(), "every token id kept");
    for (size_t i = 0; i < input->size(); ++i) {
      Check((*input)[i].is_number_integer(), "token ids are integers");
      CheckInt(&(*input)[i], r.input().tokens().ids(static_cast<int>(i)), 0, kInt32Max, 0,
               "token ids in [0, 2^31 - 1], as given");
    }
  }
  const json* commit = Field(doc, "commit");
  if (commit) Check(commit->is_boolean(), "commit a boolean");
  Check(r.commit() == (commit && *commit == true), "commit is the body's, default false");
}

void CheckCreateSession(const json& doc, const v1::CreateSessionRequest& r) {
  CheckInt(Field(doc, "mem_len"), r.mem_len(), 0, kInt64Max, 0, "mem_len >= 0, the body's");
  CheckInt(Field(doc, "idle_ttl_seconds"), r.idle_ttl_seconds(), 0, kInt64Max, 0, "idle_ttl_seconds >= 0, the body's");
  const json* labels = Field(doc, "labels");
  if (labels == nullptr) {
    Check(r.labels().empty(), "no labels");
  } else {
    Check(labels->is_object() && static_cast<size_t>(r.labels().size()) == labels->size(), "every label kept");
    for (const auto& [k, v] : labels->items()) {
      auto it = r.labels().find(k);
      Check(v.is_string() && it != r.labels().end() && it->second == v.get<std::string>(), "each label as given");
    }
  }
  const json* session = Field(doc, "session_id");
  Check(session ? session->is_string() && r.session_id() == session->get<std::string>() : r.session_id().empty(),
        "the body's session id");
  const json* model = Field(doc, "model");
  Check(model ? model->is_string() && r.model() == model->get<std::string>() : r.model().empty(), "the body's model");
}

// One parser's outcome, for the determinism check (each Run also parses an accepted body twice
// and compares the results).
struct Outcome {
  absl::Status status;
  HttpError error;
};

bool SameMessage(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

// Runs the parser once, checks its outcome against `parsed` (the body read independently;
// discarded when it is not JSON), and returns it.
Outcome Run(int parser, const std::string& body, bool header, const json& parsed) {
  // The session routes read an empty body as {}.
  const bool blank_ok = (parser == kCreateSession || parser == kPosition || parser == kRequiredPosition) && Blank(body);
  const json empty = json::object();
  const json& doc = blank_ok ? empty : parsed;
  const bool object = doc.is_object();
  Outcome out;
  HttpError& e = out.error;
  const std::string hdr = header ? kHeaderSession : "";
  try {
    switch (parser) {
      case kCompletion: {
        absl::StatusOr<CompletionParams> p = ParseCompletion(body, hdr, &e);
        out.status = p.status();
        if (p.ok()) {
          CheckCompletion(doc, *p, header);
          absl::StatusOr<CompletionParams> again = ParseCompletion(body, hdr, &e);
          Check(again.ok() && SameMessage(again->request, p->request) && again->stream == p->stream &&
                    again->include_usage == p->include_usage && again->logprobs == p->logprobs,
                "a completion parses the same twice");
        }
        break;
      }
      case kChat: {
        absl::StatusOr<ChatParams> p = ParseChat(body, hdr, &e);
        out.status = p.status();
        if (p.ok()) {
          CheckChat(doc, *p, header);
          absl::StatusOr<ChatParams> again = ParseChat(body, hdr, &e);
          Check(again.ok() && SameMessage(again->completion.request, p->completion.request) &&
                    again->completion.stream == p->completion.stream &&
                    again->completion.include_usage == p->completion.include_usage &&
                    again->completion.logprobs == p->completion.logprobs &&
                    again->messages.size() == p->messages.size(),
                "a chat parses the same twice");
          for (size_t i = 0; i < p->messages.size(); ++i) {
            Check(
                again->messages[i].role == p->messages[i].role && again->messages[i].content == p->messages[i].content,
                "a chat's messages parse the same twice");
          }
        }
        break;
      }
      case kBody: {
        absl::StatusOr<json> j = ParseBody(body, &e);
        out.status = j.status();
        if (j.ok()) {
          Check(j->is_object() && *j == doc, "the body is the JSON object it holds");
          Check(*ParseBody(body, &e) == *j, "a body parses the same twice");
        }
        break;
      }
      case kScore: {
        absl::StatusOr<v1::ScoreRequest> r = ParseScore(body, kPathSession, &e);
        out.status = r.status();
        if (r.ok()) {
          CheckScore(doc, *r);
          absl::StatusOr<v1::ScoreRequest> again = ParseScore(body, kPathSession, &e);
          Check(again.ok() && SameMessage(*again, *r), "a score parses the same twice");
        }
        break;
      }
      case kCreateSession: {
        absl::StatusOr<v1::CreateSessionRequest> r = ParseCreateSession(body, &e);
        out.status = r.status();
        if (r.ok()) {
          CheckCreateSession(doc, *r);
          absl::StatusOr<v1::CreateSessionRequest> again = ParseCreateSession(body, &e);
          Check(again.ok() && SameMessage(*again, *r), "a create parses the same twice");
        }
        break;
      }
      default: {
        const bool required = parser == kRequiredPosition;
        absl::StatusOr<int64_t> position = ParsePosition(body, required, &e);
        out.status = position.status();
        if (position.ok()) {
          Check(*position >= 0, "position >= 0");
          const json* v = Field(doc, "position");
          Check(!required || v != nullptr, "a required position is given");
          CheckInt(v, *position, 0, kInt64Max, 0, "position the body's, default 0");
          absl::StatusOr<int64_t> again = ParsePosition(body, required, &e);
          Check(again.ok() && *again == *position, "a position parses the same twice");
        }
        break;
      }
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "openai_json_fuzzer: exception: %s\n", ex.what());
    Check(false, "no exception escapes a parser (the route would answer 500)");
  }
  if (out.status.ok()) {
    Check(object, "only a JSON object (or an empty session body) is accepted");
  } else {
    CheckRefusal(parser, out.status, e, doc, object);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int parser = data[0] % kParsers;
  const bool header = (data[0] / kParsers) % 2 == 1;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);

  const Outcome first = Run(parser, body, header, doc);
  const Outcome second = Run(parser, body, header, doc);
  Check(first.status == second.status, "the same status twice");
  Check(first.error.status == second.error.status && first.error.message == second.error.message &&
            first.error.param == second.error.param && first.error.code == second.error.code,
        "the same error twice");
  return 0;
}
