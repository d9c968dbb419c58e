// OpenAI's JSON shapes <-> txl.v1 messages: the completions request, its
// response and stream chunks, and the error body. Pure functions (no gRPC,
// no sockets), so each shape is unit-tested on its own
// (tests/server/http/openai_json_test.cc). Requests are parsed in
// openai_json.cc, responses rendered in openai_render.cc.
#ifndef TXL_SERVER_HTTP_OPENAI_JSON_H_
#define TXL_SERVER_HTTP_OPENAI_JSON_H_

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/txl/v1/txl.pb.h"
#include "server/sessions/session_table.h"

namespace txl {

// A refused request: the HTTP status, and the `param` it names (may be empty).
struct HttpError {
  int status = 400;
  std::string message;
  std::string param;
  std::string code;  // e.g. "invalid_argument", the gRPC code's name in lower case
};

// JSON text; bytes that are not UTF-8 (a client's, or a token's partial
// character) become U+FFFD rather than an exception.
std::string JsonText(const nlohmann::json& j);

// {"error": {"message", "type", "param", "code"}}.
std::string ErrorBody(const HttpError& e);
// The HTTP status for a gRPC / absl status code (docs/HTTP.md, "Errors", lists the map).
int HttpStatusFor(absl::StatusCode code);

// A field a service refusal names first (RequestValidator's messages start
// with it), as the client named it: `service` is the txl.v1 field
// ("max_new_tokens", "sampling.temperature", "input.tokens.ids"), `client`
// the request's ("max_tokens", "temperature", "prompt"); `drop` is what the
// service's message says that holds only on gRPC (max_new_tokens' "(0: 16)").
struct FieldName {
  // `drop`: the start of a parenthesis in the service's message that does
  // not apply to the client's field; it is removed through its ")".
  std::string service, client, drop;
};
using FieldNames = std::vector<FieldName>;
// The session routes' names (mem_len, idle_ttl_seconds, session_id,
// position, and score's input).
const FieldNames& SessionFieldNames();
// The HTTP error for a refusal. An INVALID_ARGUMENT that names a field of
// `names` names the client's field instead, in the message and as `param`.
HttpError ErrorFromStatus(absl::StatusCode code, const std::string& message,
                          const FieldNames& names = SessionFieldNames());

struct CompletionParams {
  v1::GenerateRequest request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // "logprobs" given (0 included): each token's log-prob is returned
  bool echo = false;           // completions: the prompt too, in the text and the log-probs
  FieldNames fields;  // the request's names for the service's fields (max_tokens or max_completion_tokens, ...)
};

// Parses a /v1/completions body. The session id comes from the body's
// "session_id", else from `session_header` (txl-session-id). "model" goes
// to the request as it is: the service finds the version it names (a model
// not served is 404 model_not_found: ErrorFromStatus).
absl::StatusOr<CompletionParams> ParseCompletion(const std::string& body, const std::string& session_header,
                                                 HttpError* error);

// What one choice of a completion has produced so far.
struct CompletionChoice {
  std::string text;
  std::vector<v1::GeneratedToken> tokens;
  std::vector<v1::ScoredToken> echo;  // echo: the prompt's tokens
  std::string echo_text;              // echo: the prompt's text, before `text`
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
};

// What one completion has produced so far (the non-streaming response
// gathers every GenerateResponse into it).
struct CompletionResult {
  std::vector<CompletionChoice> choices = std::vector<CompletionChoice>(1);  // by GenerateResponse.index
  v1::Usage usage;
  int64_t position = 0;
  std::string session_id;  // only for a call that named a session (else a throw-away one's)
  bool stateful = false;
  void Add(const v1::GenerateResponse& r);
};

// The identity every chunk of one completion repeats.
struct CompletionId {
  std::string id;  // "cmpl-..."
  int64_t created = 0;
  std::string model;
};

// "length" or "stop" (a stop token or sequence); null while unfinished.
nlohmann::json FinishReasonJson(v1::FinishReason f);
// A choice's logprobs for these tokens (after the echoed prompt's, whose
// first has a null log-prob and whose alternatives are null), `offset` bytes
// into the completion's text.
nlohmann::json LogprobsJson(const std::vector<v1::ScoredToken>& echo, const std::vector<v1::GeneratedToken>& tokens,
                            int64_t offset);
// The echoed prompt's text: its tokens' texts joined (whole characters, as
// the service splits them), which the log-probs' text offsets count.
std::string EchoText(const std::vector<v1::ScoredToken>& echo);
// The non-streaming response.
std::string CompletionBody(const CompletionId& id, const CompletionResult& r, bool logprobs);
// One "data: {...}\n\n" event for a GenerateResponse; `offset`: text bytes
// sent before it. `session` (empty for a stateless call) and the position
// are named in every event of a session's completion. `echo_text`: the
// prompt's text, for the response that carries its tokens (echo).
std::string CompletionChunk(const CompletionId& id, const v1::GenerateResponse& r, bool logprobs, int64_t offset,
                            const std::string& session, const std::string& echo_text = "");
// The usage event (stream_options.include_usage): empty choices.
std::string UsageChunk(const CompletionId& id, const v1::Usage& usage, int64_t position, const std::string& session);

// One chat message: role is "system", "user" or "assistant" ("developer"
// is read as "system"); content is its text (text parts joined).
struct ChatMessage {
  std::string role;
  std::string content;
};
struct ChatParams {
  CompletionParams completion;  // request.input is set by the gateway (the rendered new messages)
  std::vector<ChatMessage> messages;
};
// Parses a /v1/chat/completions body (as ParseCompletion; "logprobs" is a
// boolean here, with "top_logprobs").
absl::StatusOr<ChatParams> ParseChat(const std::string& body, const std::string& session_header, HttpError* error);

// The chat shapes: "chat.completion" and its "chat.completion.chunk"s.
std::string ChatBody(const CompletionId& id, const CompletionResult& r, bool logprobs);
// `first`: the chunk that carries the assistant's role.
std::string ChatChunk(const CompletionId& id, const v1::GenerateResponse& r, bool logprobs, bool first,
                      const std::string& session);
std::string ChatUsageChunk(const CompletionId& id, const v1::Usage& usage, int64_t position,
                           const std::string& session);

// A body parsed as a JSON object, else 400 naming what is wrong.
absl::StatusOr<nlohmann::json> ParseBody(const std::string& body, HttpError* error);

// A txl.v1.Session as JSON: the proto's field names, integers as numbers,
// times as Unix seconds, "object": "session".
nlohmann::json SessionJson(const SessionInfo& s);
// POST /v1/sessions/ID/score: {"input": string or token ids, "commit": bool}.
absl::StatusOr<v1::ScoreRequest> ParseScore(const std::string& body, const std::string& session, HttpError* error);
nlohmann::json ScoreJson(const std::string& session, const v1::ScoreResponse& r);
// POST /v1/sessions and POST /v1/sessions/ID/fork bodies (may be empty):
// mem_len, idle_ttl_seconds, labels, session_id and model (create only).
absl::StatusOr<v1::CreateSessionRequest> ParseCreateSession(const std::string& body, HttpError* error);
// {"position": N}: a rewind's target (`required`), or where a fork branches
// (optional: 0, the source's position). Other fields are ParseCreateSession's.
absl::StatusOr<int64_t> ParsePosition(const std::string& body, bool required, HttpError* error);

}  // namespace txl

#endif  // TXL_SERVER_HTTP_OPENAI_JSON_H_
