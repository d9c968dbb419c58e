#include "server/http/openai_json.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/sampling/json_bounds.h"

namespace txl {
namespace {

using json = nlohmann::json;

const char* ErrorType(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 409: return "conflict_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

HttpError Bad(const std::string& param, const std::string& message) {
  return HttpError{400, message, param, "invalid_argument"};
}

// Reads an optional number field that must hold an integer in [lo, hi].
bool IntField(const json& body, const char* name, int64_t lo, int64_t hi, int64_t* out, HttpError* error) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_number_integer() && !(it->is_number_float() && std::floor(it->get<double>()) == it->get<double>())) {
    *error = Bad(name, absl::StrCat("'", name, "' must be an integer"));
    return false;
  }
  // Compared as integers: a double cannot hold every int64 (2^63 - 1 rounds
  // up to 2^63, and a float past it does not convert).
  bool in_range = false;
  int64_t value = 0;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    value = in_range ? static_cast<int64_t>(u) : 0;
  } else if (it->is_number_integer()) {
    value = it->get<int64_t>();
    in_range = true;
  } else {
    const double v = it->get<double>();
    in_range = v >= -0x1p63 && v < 0x1p63;
    value = in_range ? static_cast<int64_t>(v) : 0;
  }
  if (!in_range || value < lo || value > hi) {
    *error = Bad(name, absl::StrCat("'", name, "' must be in [", lo, ", ", hi, "], got ", JsonText(*it)));
    return false;
  }
  *out = value;
  return true;
}

// An optional number field the request holds as a float.
bool FloatField(const json& body, const char* name, float* out, HttpError* error) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_number()) {
    *error = Bad(name, absl::StrCat("'", name, "' must be a number"));
    return false;
  }
  const double v = it->get<double>();
  if (!(std::fabs(v) <= std::numeric_limits<float>::max())) {
    *error = Bad(name, absl::StrCat("'", name, "' is out of range: ", JsonText(*it), " is beyond a float (3.4e38)"));
    return false;
  }
  *out = static_cast<float>(v);
  return true;
}

bool BoolField(const json& body, const char* name, bool* out, HttpError* error) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_boolean()) {
    *error = Bad(name, absl::StrCat("'", name, "' must be true or false"));
    return false;
  }
  *out = it->get<bool>();
  return true;
}

}  // namespace

std::string JsonText(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string ErrorBody(const HttpError& e) {
  json err{{"message", e.message},
           {"type", ErrorType(e.status)},
           {"param", e.param.empty() ? json(nullptr) : json(e.param)},
           {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return JsonText(json{{"error", err}});
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted: return 409;  // e.g. a session busy with another request
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kCancelled: return 499;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

const FieldNames& SessionFieldNames() {
  static const FieldNames* names =
      new FieldNames{{"mem_len", "mem_len", ""},       {"idle_ttl_seconds", "idle_ttl_seconds", ""},
                     {"session_id", "session_id", ""}, {"position", "position", ""},
                     {"input", "input", ""},           {"input.text", "input", ""},
                     {"input.tokens.ids", "input", ""}};
  return *names;
}

HttpError ErrorFromStatus(absl::StatusCode code, const std::string& message, const FieldNames& names) {
  HttpError e{HttpStatusFor(code), message, "", absl::AsciiStrToLower(absl::StatusCodeToString(code))};
  // A model or version not served (ModelSource::Find: 'model "NAME" ...'), as OpenAI names it.
  if (code == absl::StatusCode::kNotFound && message.rfind("model \"", 0) == 0) {
    e.param = "model";
    e.code = "model_not_found";
    return e;
  }
  if (code != absl::StatusCode::kInvalidArgument) return e;
  if (message.rfind("model: ", 0) == 0) {
    e.param = "model";
    return e;
  }
  // "max_new_tokens: must be in ...", "sampling.temperature must be ...", "input.tokens.ids[3]: ...".
  const std::string field = message.substr(0, message.find_first_of(": ["));
  for (const FieldName& name : names) {
    if (name.service != field) continue;
    std::string rest = message.substr(field.size());
    // `drop` starts a parenthesis the client's field has no use for: it goes, through its ")".
    if (const size_t at = name.drop.empty() ? std::string::npos : rest.find(name.drop); at != std::string::npos) {
      const size_t close = rest.find(')', at);
      rest.erase(at, close == std::string::npos ? name.drop.size() : close + 1 - at);
    }
    e.message = name.client + rest;
    e.param = name.client;
    break;
  }
  return e;
}

namespace {

// Where a parse stopped, as a field path ("temperature", "prompt[2]",
// "stream_options.include_usage"): json::parse says that a number
// overflowed a double, but not in which field.
class FieldLocator final : public nlohmann::json_sax<json> {
 public:
  bool null() override { return Element(); }
  bool boolean(bool) override { return Element(); }
  bool number_integer(number_integer_t) override { return Element(); }
  bool number_unsigned(number_unsigned_t) override { return Element(); }
  bool number_float(number_float_t, const string_t&) override { return Element(); }
  bool string(string_t&) override { return Element(); }
  bool binary(binary_t&) override { return Element(); }
  bool start_object(std::size_t) override { return Open(false); }
  bool key(string_t& key) override {
    frames_.back().key = key;
    return true;
  }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(true); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string& token, const json::exception&) override {
    token_ = token;
    return false;
  }

  std::string Path() const {
    std::string path;
    for (const Frame& f : frames_) {
      if (f.array) {
        absl::StrAppend(&path, "[", f.index, "]");
      } else {
        absl::StrAppend(&path, path.empty() ? "" : ".", f.key);
      }
    }
    return path;
  }
  // The token the parse stopped at, cut short.
  std::string token() const { return token_.size() > 40 ? token_.substr(0, 40) + "..." : token_; }

 private:
  struct Frame {
    bool array = false;
    size_t index = 0;  // an array's elements before the current one
    std::string key;   // an object's current key
  };
  bool Open(bool array) {
    frames_.push_back(Frame{array, 0, ""});
    return true;
  }
  bool Close() {
    frames_.pop_back();
    return Element();
  }
  bool Element() {  // a value ended: an array moves on to its next element
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  std::vector<Frame> frames_;
  std::string token_;
};

}  // namespace

absl::StatusOr<json> ParseBody(const std::string& body, HttpError* error) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::out_of_range& e) {  // a number a double cannot hold (1e999): JSON allows it
    FieldLocator where;
    json::sax_parse(body, &where);
    std::string path = where.Path();
    if (!path.empty() && path[0] == '[') path.clear();  // not an object: no field to name
    *error = Bad(path, absl::StrCat(path.empty() ? "the request body" : absl::StrCat("'", path, "'"),
                                    " is out of range: ", where.token(), " is beyond a double (1.8e308)"));
    return absl::InvalidArgumentError(error->message);
  } catch (const json::exception& e) {
    *error = Bad("", absl::StrCat("the request body is not valid JSON (", e.what(), ")"));
    return absl::InvalidArgumentError(error->message);
  }
  if (!j.is_object()) {
    *error = Bad("", "the request body must be a JSON object");
    return absl::InvalidArgumentError(error->message);
  }
  return j;
}

namespace {

// The fields /v1/completions and /v1/chat/completions share: the model,
// sampling, stop, n, stream, the session, and the options refused.
// response_format: text, json_object, or json_schema with its schema (taken
// from `body` again, in its own key order: properties are written in order).
bool ParseResponseFormat(const json& j, const std::string& body, v1::GenerateRequest* r, HttpError* error) {
  auto it = j.find("response_format");
  if (it == j.end() || it->is_null()) return true;
  const char* kTypes = "\"text\", \"json_object\" or \"json_schema\"";
  if (!it->is_object()) {
    *error = Bad("response_format", absl::StrCat("'response_format' must be an object whose 'type' is ", kTypes));
    return false;
  }
  auto type = it->find("type");
  const std::string t = type != it->end() && type->is_string() ? type->get<std::string>() : "";
  v1::ResponseFormat* f = r->mutable_response_format();
  if (t == "text") {
    f->set_type(v1::ResponseFormat::TYPE_TEXT);
  } else if (t == "json_object") {
    f->set_type(v1::ResponseFormat::TYPE_JSON_OBJECT);
  } else if (t == "json_schema") {
    auto spec = it->find("json_schema");
    if (spec == it->end() || !spec->is_object() || !spec->contains("schema")) {
      *error = Bad("response_format.json_schema",
                   "'response_format.json_schema' must be an object with the JSON Schema in 'schema'");
      return false;
    }
    // Again in order, response_format alone; its nesting and keys bounded
    // before dump() recurses over it (the core bounds its bytes). The body
    // parsed once already, so it parses again.
    using Ordered = nlohmann::ordered_json;
    JsonBounds bounds;
    bool in_format = false;  // within the body's response_format (the other fields are skipped)
    Ordered ordered;
    try {
      ordered = Ordered::parse(body, [&](int depth, Ordered::parse_event_t event, Ordered& parsed) {
        if (event == Ordered::parse_event_t::key && depth == 1) {
          in_format = parsed == "response_format";
          return in_format;
        }
        if (in_format && depth >= 1) bounds.Count(depth, event == Ordered::parse_event_t::key);
        return true;
      });
    } catch (const std::length_error&) {
      *error = Bad("response_format.json_schema.schema",
                   absl::StrCat("'response_format.json_schema.schema': ", bounds.why()));
      return false;
    }
    f->set_type(v1::ResponseFormat::TYPE_JSON_SCHEMA);
    f->set_json_schema(ordered["response_format"]["json_schema"]["schema"].dump());
  } else {
    *error = Bad("response_format.type", absl::StrCat("'response_format.type' must be ", kTypes));
    return false;
  }
  return true;
}

bool ParseCommon(const json& j, const std::string& session_header, bool chat, CompletionParams* p, HttpError* error) {
  auto fail = [&](HttpError e) {
    *error = std::move(e);
    return false;
  };
  v1::GenerateRequest& r = p->request;
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return fail(Bad("model", "'model' must be a string"));
    r.set_model(it->get<std::string>());  // the service finds it (404 model_not_found when it is not served)
  }
  int64_t max_tokens = 0, n = 1, seed = 0;  // max_tokens absent: the service's default (16, or the model's less)
  // Chat's newer name for max_tokens; the older one wins when both are sent.
  const char* max_tokens_field = "max_tokens";
  if (j.contains("max_completion_tokens") && !j.contains(max_tokens_field)) max_tokens_field = "max_completion_tokens";
  // What the service's refusals name, as this request names it.
  const std::string input_field = chat ? "messages" : "prompt";
  p->fields = {{"max_new_tokens", max_tokens_field, " (0: "},  // the service's default for 0: absent here
               {"sampling.temperature", "temperature", ""},
               {"sampling.top_p", "top_p", ""},
               {"sampling.seed", "seed", ""},
               {"sampling.logit_bias", "logit_bias", ""},
               {"sampling.presence_penalty", "presence_penalty", ""},
               {"sampling.frequency_penalty", "frequency_penalty", ""},
               {"stop_sequences", "stop", ""},
               {"logprobs", chat ? "top_logprobs" : "logprobs", ""},
               {"input", input_field, ""},
               {"input.text", input_field, ""},
               {"input.tokens.ids", input_field, ""},
               {"session_id", "session_id", ""},
               {"grammar", "grammar", ""},
               {"response_format", "response_format", ""},
               {"response_format.type", "response_format.type", ""},
               {"response_format.json_schema", "response_format.json_schema.schema", ""},
               {"n", "n", " (0: "},  // 0 is not a client's n
               {"best_of", "best_of", " (0: "}};
  if (!IntField(j, max_tokens_field, 0, std::numeric_limits<int32_t>::max(), &max_tokens, error) ||
      !IntField(j, "n", 1, std::numeric_limits<int32_t>::max(), &n, error) ||
      !IntField(j, "seed", 0, std::numeric_limits<int64_t>::max(), &seed, error) ||
      !BoolField(j, "echo", &p->echo, error)) {
    return false;
  }
  r.set_n(static_cast<int32_t>(n));  // the service checks it against --max_n and the session
  if (p->echo && chat) return fail(Bad("echo", "'echo' is for /v1/completions (chat has no prompt to echo)"));
  r.set_echo(p->echo);
  const bool max_tokens_zero = max_tokens == 0 && j.contains(max_tokens_field) && !j[max_tokens_field].is_null();
  if (max_tokens_zero && !p->echo) {
    return fail(Bad(max_tokens_field, absl::StrCat("'", max_tokens_field, "' must be at least 1",
                                                   chat ? "" : " (0, generating nothing, only with 'echo')")));
  }
  // 0 with echo: the prompt's log-probs alone (the service's -1); absent: its default.
  r.set_max_new_tokens(max_tokens_zero ? -1 : static_cast<int32_t>(max_tokens));
  float temperature = 1.0f, top_p = 1.0f;  // OpenAI's defaults
  if (!FloatField(j, "temperature", &temperature, error) || !FloatField(j, "top_p", &top_p, error)) return false;
  r.mutable_sampling()->set_temperature(temperature);
  r.mutable_sampling()->set_top_p(top_p);
  r.mutable_sampling()->set_seed(static_cast<uint64_t>(seed));

  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      r.add_stop_sequences(it->get<std::string>());
    } else if (it->is_array()) {
      for (const json& s : *it) {
        if (!s.is_string()) return fail(Bad("stop", "'stop' must be a string or an array of strings"));
        r.add_stop_sequences(s.get<std::string>());
      }
    } else {
      return fail(Bad("stop", "'stop' must be a string or an array of strings"));
    }
  }
  // The constrained-output extension: a grammar the text must follow (as llama.cpp's server names it).
  if (auto it = j.find("grammar"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return fail(Bad("grammar", "'grammar' must be a string (the grammar's text)"));
    r.set_grammar(it->get<std::string>());
  }
  if (auto it = j.find("user"); it != j.end() && !it->is_null() && !it->is_string()) {
    return fail(Bad("user", "'user' must be a string"));
  }
  // Options this server does not implement: refused when they would change
  // the result, rather than silently ignored.
  for (const char* field : {"suffix", "tools", "functions"}) {
    if (auto it = j.find(field); it != j.end() && !it->is_null()) {
      return fail(Bad(field, absl::StrCat("'", field, "' is not supported")));
    }
  }
  if (auto it = j.find("best_of"); it != j.end() && !it->is_null()) {
    int64_t best_of = 0;
    if (!IntField(j, "best_of", 1, std::numeric_limits<int32_t>::max(), &best_of, error)) return false;
    if (chat && best_of != 1) return fail(Bad("best_of", "'best_of' is for /v1/completions (chat has n alone)"));
    if (best_of < n) return fail(Bad("best_of", absl::StrCat("'best_of' must be at least n (", n, "), got ", best_of)));
    r.set_best_of(static_cast<int32_t>(best_of));
  }
  float presence = 0.0f, frequency = 0.0f;
  if (!FloatField(j, "presence_penalty", &presence, error) || !FloatField(j, "frequency_penalty", &frequency, error)) {
    return false;
  }
  r.mutable_sampling()->set_presence_penalty(presence);
  r.mutable_sampling()->set_frequency_penalty(frequency);
  // {"TOKEN_ID": bias, ...}: the ids as OpenAI writes them, decimal strings.
  if (auto it = j.find("logit_bias"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return fail(Bad("logit_bias", "'logit_bias' must be an object of token ids to biases"));
    auto& bias = *r.mutable_sampling()->mutable_logit_bias();
    for (const auto& [key, value] : it->items()) {
      int token = 0;
      if (key.empty() || key.size() > 10 || !absl::SimpleAtoi(key, &token) || token < 0 ||
          key.find_first_not_of("0123456789") != std::string::npos) {
        return fail(Bad("logit_bias", absl::StrCat("'logit_bias': \"", key.substr(0, 32),
                                                   "\" is not a token id (a decimal integer >= 0)")));
      }
      if (!value.is_number()) {
        return fail(Bad("logit_bias", absl::StrCat("'logit_bias': the bias of token ", token, " must be a number")));
      }
      const double v = value.get<double>();
      if (!(v >= -100 && v <= 100)) {
        return fail(Bad("logit_bias", absl::StrCat("'logit_bias': the bias of token ", token,
                                                   " must be in [-100, 100], got ", JsonText(value))));
      }
      bias[token] = static_cast<float>(v);
    }
  }

  if (!BoolField(j, "stream", &p->stream, error)) return false;
  // The best are known only once every candidate has ended.
  if (p->stream && r.best_of() > r.n()) return fail(Bad("best_of", "'best_of' above n cannot be streamed"));
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return fail(Bad("stream_options", "'stream_options' must be an object"));
    if (!p->stream) return fail(Bad("stream_options", "'stream_options' is only allowed with 'stream': true"));
    if (!BoolField(*it, "include_usage", &p->include_usage, error)) return false;
  }
  // The stateful extension: a session this call continues.
  if (auto it = j.find("session_id"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return fail(Bad("session_id", "'session_id' must be a string"));
    r.set_session_id(it->get<std::string>());
  } else {
    r.set_session_id(session_header);
  }
  return true;
}

}  // namespace

absl::StatusOr<CompletionParams> ParseCompletion(const std::string& body, const std::string& session_header,
                                                 HttpError* error) {
  auto fail = [&](HttpError e) {
    *error = std::move(e);
    return absl::InvalidArgumentError(error->message);
  };
  ASSIGN_OR_RETURN(json j, ParseBody(body, error));
  CompletionParams p;
  v1::GenerateRequest& r = p.request;
  if (!ParseCommon(j, session_header, /*chat=*/false, &p, error) || !ParseResponseFormat(j, body, &p.request, error)) {
    return absl::InvalidArgumentError(error->message);
  }
  // prompt: a string, one string in an array, or token ids.
  auto prompt = j.find("prompt");
  if (prompt == j.end() || prompt->is_null()) return fail(Bad("prompt", "'prompt' is required"));
  if (prompt->is_string()) {
    r.mutable_input()->set_text(prompt->get<std::string>());
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    r.mutable_input()->set_text((*prompt)[0].get<std::string>());
  } else if (prompt->is_array() && (prompt->empty() || (*prompt)[0].is_number_integer())) {
    auto* ids = r.mutable_input()->mutable_tokens();
    for (const json& t : *prompt) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return fail(Bad("prompt", "'prompt' as an array holds token ids: non-negative integers"));
      }
      ids->add_ids(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    return fail(Bad("prompt",
                    "'prompt' must be a string, or an array of token ids (batches of prompts are not "
                    "supported: send one request each)"));
  }
  int64_t logprobs = -1;
  if (!IntField(j, "logprobs", 0, std::numeric_limits<int32_t>::max(), &logprobs, error)) {
    return absl::InvalidArgumentError(error->message);
  }
  if (logprobs >= 0) {
    p.logprobs = true;
    r.set_logprobs(static_cast<int32_t>(logprobs));
  }
  return p;
}

absl::StatusOr<ChatParams> ParseChat(const std::string& body, const std::string& session_header, HttpError* error) {
  auto fail = [&](HttpError e) {
    *error = std::move(e);
    return absl::InvalidArgumentError(error->message);
  };
  ASSIGN_OR_RETURN(json j, ParseBody(body, error));
  ChatParams p;
  if (!ParseCommon(j, session_header, /*chat=*/true, &p.completion, error) ||
      !ParseResponseFormat(j, body, &p.completion.request, error)) {
    return absl::InvalidArgumentError(error->message);
  }
  auto messages = j.find("messages");
  if (messages == j.end() || !messages->is_array() || messages->empty()) {
    return fail(Bad("messages", "'messages' must be a non-empty array of {\"role\", \"content\"}"));
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return fail(Bad(where, absl::StrCat(where, " must be an object with a string 'role'")));
    }
    ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    if (msg.role != "system" && msg.role != "developer" && msg.role != "user" && msg.role != "assistant") {
      return fail(
          Bad(where, absl::StrCat(where, ".role '", msg.role, "' is not one of system, developer, user, assistant")));
    }
    if (msg.role == "developer") msg.role = "system";
    const json content = m.value("content", json(nullptr));
    if (content.is_string()) {
      msg.content = content.get<std::string>();
    } else if (content.is_array()) {  // parts: only text
      for (const json& part : content) {
        if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return fail(Bad(where, absl::StrCat(where, ".content: only parts of type 'text' are supported")));
        }
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return fail(Bad(where, absl::StrCat(where, ".content must be a string or an array of text parts")));
    }
    p.messages.push_back(std::move(msg));
  }
  bool logprobs = false;
  int64_t top = 0;
  if (!BoolField(j, "logprobs", &logprobs, error) ||
      !IntField(j, "top_logprobs", 0, std::numeric_limits<int32_t>::max(), &top, error)) {
    return absl::InvalidArgumentError(error->message);
  }
  if (top > 0 && !logprobs) return fail(Bad("top_logprobs", "'top_logprobs' needs 'logprobs': true"));
  if (logprobs) {
    p.completion.logprobs = true;
    p.completion.request.set_logprobs(static_cast<int32_t>(top));
  }
  return p;
}

absl::StatusOr<v1::CreateSessionRequest> ParseCreateSession(const std::string& body, HttpError* error) {
  auto fail = [&](HttpError e) {
    *error = std::move(e);
    return absl::InvalidArgumentError(error->message);
  };
  v1::CreateSessionRequest r;
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) return r;
  ASSIGN_OR_RETURN(json j, ParseBody(body, error));
  int64_t mem_len = 0, ttl = 0;
  if (!IntField(j, "mem_len", 0, std::numeric_limits<int64_t>::max(), &mem_len, error) ||
      !IntField(j, "idle_ttl_seconds", 0, std::numeric_limits<int64_t>::max(), &ttl, error)) {
    return absl::InvalidArgumentError(error->message);
  }
  r.set_mem_len(mem_len);
  r.set_idle_ttl_seconds(ttl);
  if (auto it = j.find("labels"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return fail(Bad("labels", "'labels' must be an object of strings"));
    for (auto& [k, v] : it->items()) {
      if (!v.is_string()) return fail(Bad("labels", "'labels' must be an object of strings"));
      (*r.mutable_labels())[k] = v.get<std::string>();
    }
  }
  if (auto it = j.find("session_id"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return fail(Bad("session_id", "'session_id' must be a string"));
    r.set_session_id(it->get<std::string>());
  }
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return fail(Bad("model", "'model' must be a string"));
    r.set_model(it->get<std::string>());
  }
  return r;
}

absl::StatusOr<int64_t> ParsePosition(const std::string& body, bool required, HttpError* error) {
  auto fail = [&](HttpError e) {
    *error = std::move(e);
    return absl::InvalidArgumentError(error->message);
  };
  json j = json::object();
  if (body.find_first_not_of(" \t\r\n") != std::string::npos) {
    ASSIGN_OR_RETURN(j, ParseBody(body, error));
  }
  auto it = j.find("position");
  if (required && (it == j.end() || it->is_null()))
    return fail(Bad("position", "'position' is required: the history position to go back to"));
  int64_t position = 0;
  if (!IntField(j, "position", 0, std::numeric_limits<int64_t>::max(), &position, error))
    return absl::InvalidArgumentError(error->message);
  return position;
}

absl::StatusOr<v1::ScoreRequest> ParseScore(const std::string& body, const std::string& session, HttpError* error) {
  auto fail = [&](HttpError e) {
    *error = std::move(e);
    return absl::InvalidArgumentError(error->message);
  };
  ASSIGN_OR_RETURN(json j, ParseBody(body, error));
  v1::ScoreRequest r;
  r.set_session_id(session);
  auto input = j.find("input");
  if (input == j.end() || input->is_null()) return fail(Bad("input", "'input' is required"));
  if (input->is_string()) {
    r.mutable_input()->set_text(input->get<std::string>());
  } else if (input->is_array()) {
    for (const json& t : *input) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return fail(Bad("input", "'input' as an array holds token ids: non-negative integers"));
      }
      r.mutable_input()->mutable_tokens()->add_ids(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    return fail(Bad("input", "'input' must be a string or an array of token ids"));
  }
  bool commit = false;
  if (!BoolField(j, "commit", &commit, error)) return absl::InvalidArgumentError(error->message);
  r.set_commit(commit);
  return r;
}

}  // namespace txl
