// RequestValidator: the checks TxlService runs on a request before it takes a
// session or touches the scheduler, as pure functions of the request message,
// the txl-session-id metadata and the server's limits. No gRPC and no torch:
// the fuzz target tests/fuzz/request_validation_fuzzer.cc runs exactly the
// code the service runs.
//
// Every error is INVALID_ARGUMENT whose message starts with the field at
// fault ("mem_len: ...", "input.tokens.ids[3]: ...", "sampling.top_p ...").
//
// Threading: immutable after construction; const methods may be called from
// any number of threads at once.
#ifndef TXL_SERVER_CORE_REQUEST_VALIDATION_H_
#define TXL_SERVER_CORE_REQUEST_VALIDATION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/tokenizer.h"
#include "proto/txl/v1/txl.pb.h"
#include "server/jobs/generate_spec.h"
#include "server/sampling/grammar_cache.h"

namespace txl {

class ServedModel;  // server/engine/served_model.h

struct RequestLimits {
  int64_t n_token = 256;  // token ids must be in [0, n_token)
  int64_t default_mem_len = 256;
  int64_t max_mem_len = 4096;
  int max_new_tokens = 4096;  // per request
  int64_t max_input_tokens = 65536;
  int max_top_logprobs = 20;
  // Stop conditions: each stop sequence is matched against the decoded text
  // after every token, so their number and length bound per-token work.
  int max_stop_sequences = 16;
  int max_stop_sequence_bytes = 256;
  int max_stop_token_ids = 256;
  int max_n = 16;  // choices (n, best_of) of one request
};

// The form of a session id: 128 bits as 32 lowercase hex characters.
bool IsSessionIdForm(std::string_view id);

// The session id of a call: the request field, or else the txl-session-id
// metadata (`metadata` null when the call has none). Both given and different:
// INVALID_ARGUMENT naming session_id. May be empty (no id given).
absl::StatusOr<std::string> ResolveSessionId(const std::string& field, const std::string* metadata);

// CreateSession's arguments, checked.
struct NewSessionArgs {
  int64_t mem_len = 0;                 // resolved: 0 became the default
  absl::Duration idle_ttl;             // >= 0; the session table applies its default and maximum
  std::string session_id;              // empty or of IsSessionIdForm
  std::shared_ptr<ServedModel> model;  // the version it is made of (ServiceCore's checks set it)
};

// A Generate or Converse turn, checked.
struct GenerateArgs {
  std::string session_id;  // empty: a throw-away (or the stream's) session
  GenerateSpec spec;
  std::shared_ptr<ServedModel> model;  // the version its input was read for (ServiceCore's checks)
  // Choices returned, and candidates drawn (the n best of best_of); above 1
  // only without a session (ServiceCore::Generate).
  int n = 1;
  int best_of = 1;
};

// A Score call, checked.
struct ScoreArgs {
  std::string session_id;  // empty: a throw-away session
  std::vector<int> input;
  std::shared_ptr<ServedModel> model;  // as GenerateArgs'
};

class RequestValidator {
 public:
  // `tokenizer` (the model version's) must outlive the validator: a
  // validator is made per request, for the version the request names.
  // `grammars`: the model's kept grammars (for its tokenizer), or null.
  RequestValidator(const RequestLimits& limits, const Tokenizer& tokenizer, GrammarCache* grammars = nullptr)
      : limits_(limits), tokenizer_(&tokenizer), grammars_(grammars) {}
  // No model yet (an import's settings, whose model its image names): the
  // checks that need none; input is refused.
  explicit RequestValidator(const RequestLimits& limits) : limits_(limits), tokenizer_(nullptr) {}

  const RequestLimits& limits() const { return limits_; }

  // Token ids in [0, n_token), or text the tokenizer encodes; at most
  // max_input_tokens either way. No input at all is an empty list.
  absl::StatusOr<std::vector<int>> DecodeInput(const v1::Input& in) const;
  // 0: the default; else in [1, max_mem_len].
  absl::StatusOr<int64_t> MemLen(int64_t requested) const;
  // The request's input, max_new_tokens (0: 16, or the limit when less; -1: none, only with
  // echo), sampling, stop tokens and sequences, logprobs, echo, grammar. The session id is not looked at.
  absl::StatusOr<GenerateSpec> Spec(const v1::GenerateRequest& req) const;
  // A request's grammar (server/sampling/grammar.h), for this model: parsed,
  // some token can begin it, and its masker (GrammarCache's, when given).
  absl::StatusOr<CheckedGrammar> ParseGrammar(const std::string& text) const;
  // A request's response_format (json_object or json_schema), written as a
  // grammar (server/sampling/json_schema.h) and parsed as ParseGrammar does.
  absl::StatusOr<CheckedGrammar> ResponseFormatGrammar(const v1::ResponseFormat& format) const;

  // Whole requests, checked in the order the service always has: the
  // request's own fields and the id (field against metadata) as each RPC
  // reads them. `metadata_session_id` null: the call has no such metadata.
  absl::StatusOr<NewSessionArgs> CreateSession(const v1::CreateSessionRequest& req,
                                               const std::string* metadata_session_id) const;
  absl::StatusOr<GenerateArgs> Generate(const v1::GenerateRequest& req, const std::string* metadata_session_id) const;
  absl::StatusOr<ScoreArgs> Score(const v1::ScoreRequest& req, const std::string* metadata_session_id) const;
  // A session's labels: keys starting with "txl." are the server's.
  static absl::Status Labels(const std::map<std::string, std::string>& labels);
  // RewindSession's and ForkSession's position: not negative (whether the
  // session reaches it is known only on the engine thread).
  static absl::Status HistoryPosition(int64_t position);
  // Once the session is known (the service holds its lease): a generation
  // needs input, or history to continue from.
  static absl::Status Continuation(const GenerateSpec& spec, int64_t session_position);

 private:
  RequestLimits limits_;
  const Tokenizer* tokenizer_;
  GrammarCache* grammars_ = nullptr;
};

}  // namespace txl

#endif  // TXL_SERVER_CORE_REQUEST_VALIDATION_H_
