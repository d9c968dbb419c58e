#include "server/core/request_validation.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/sampling/json_schema.h"
#include "server/sampling/sampler.h"

namespace txl {

bool IsSessionIdForm(std::string_view id) {
  if (id.size() != 32) return false;
  for (char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

absl::StatusOr<std::string> ResolveSessionId(const std::string& field, const std::string* metadata) {
  if (metadata == nullptr) return field;
  if (!field.empty() && field != *metadata) {
    return absl::InvalidArgumentError("session_id: differs from the txl-session-id metadata of the same call");
  }
  return *metadata;
}

absl::StatusOr<std::vector<int>> RequestValidator::DecodeInput(const v1::Input& in) const {
  std::vector<int> ids;
  if (in.has_tokens()) {
    const int64_t V = limits_.n_token;
    if (tokenizer_ == nullptr) return absl::InvalidArgumentError("input: no model to read it with");
    for (int i = 0; i < in.tokens().ids_size(); ++i) {
      const int id = in.tokens().ids(i);
      if (id < 0 || id >= V) {
        return absl::InvalidArgumentError(absl::StrCat("input.tokens.ids[", i, "]: ", id, " is outside [0, ", V, ")"));
      }
      ids.push_back(id);
    }
  } else if (in.has_text()) {
    if (tokenizer_ == nullptr) return absl::InvalidArgumentError("input: no model to read it with");
    auto encoded = tokenizer_->Encode(in.text());
    if (!encoded.ok()) return absl::InvalidArgumentError(absl::StrCat("input.text: ", encoded.status().message()));
    ids = *std::move(encoded);
  }
  if (static_cast<int64_t>(ids.size()) > limits_.max_input_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("input: ", ids.size(), " tokens, more than the limit of ", limits_.max_input_tokens));
  }
  return ids;
}

absl::StatusOr<int64_t> RequestValidator::MemLen(int64_t requested) const {
  if (requested == 0) return limits_.default_mem_len;
  if (requested < 1 || requested > limits_.max_mem_len) {
    return absl::InvalidArgumentError(absl::StrCat("mem_len: must be in [1, ", limits_.max_mem_len, "] (0: default ",
                                                   limits_.default_mem_len, "), got ", requested));
  }
  return requested;
}

absl::StatusOr<GenerateSpec> RequestValidator::Spec(const v1::GenerateRequest& req) const {
  GenerateSpec spec;
  ASSIGN_OR_RETURN(spec.input, DecodeInput(req.input()));
  // 0: 16, or the limit when that is less (a model's limits.json may set it lower).
  const int default_new_tokens = std::min(16, limits_.max_new_tokens);
  spec.echo = req.echo();
  spec.max_new_tokens = req.max_new_tokens() == 0 ? default_new_tokens : req.max_new_tokens();
  if (req.max_new_tokens() == -1 && spec.echo) {
    spec.max_new_tokens = 0;  // the input's log-probs alone
    if (spec.input.empty())
      return absl::InvalidArgumentError("input: empty, and echo generating nothing has nothing to return");
  } else if (req.max_new_tokens() == -1) {
    return absl::InvalidArgumentError(
        "max_new_tokens: -1 (none) is only for echo, which returns the input's log-probs");
  } else if (spec.max_new_tokens < 1 || spec.max_new_tokens > limits_.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens: must be in [1, ", limits_.max_new_tokens,
                                                   "] (0: ", default_new_tokens, "; -1: none, with echo), got ",
                                                   req.max_new_tokens()));
  }
  spec.sampling.temperature = req.sampling().temperature();
  spec.sampling.top_k = req.sampling().top_k();
  spec.sampling.top_p = req.sampling().top_p();
  spec.sampling.seed = req.sampling().seed();
  spec.sampling.presence_penalty = req.sampling().presence_penalty();
  spec.sampling.frequency_penalty = req.sampling().frequency_penalty();
  int64_t banned = 0;
  for (const auto& [token, bias] : req.sampling().logit_bias()) {
    if (token >= limits_.n_token) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias: token ", token, " is outside the vocabulary of ", limits_.n_token));
    }
    spec.sampling.logit_bias.emplace_back(token, bias);
    banned += bias <= -100.0f ? 1 : 0;
  }
  std::sort(spec.sampling.logit_bias.begin(), spec.sampling.logit_bias.end());  // the map's order is not fixed
  RETURN_IF_ERROR(ValidateSampling(spec.sampling));
  if (banned > 0 && banned >= limits_.n_token) {
    return absl::InvalidArgumentError("sampling.logit_bias: every token of the vocabulary is banned (-100)");
  }
  // A k of the whole vocabulary or more limits nothing: said so here, the
  // sampler walks whole rows instead of asking the model for a list of all
  // n_token words.
  if (spec.sampling.top_k >= limits_.n_token) spec.sampling.top_k = 0;
  if (req.stop_token_ids_size() > limits_.max_stop_token_ids) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop_token_ids: at most ", limits_.max_stop_token_ids, " ids, got ", req.stop_token_ids_size()));
  }
  if (req.stop_sequences_size() > limits_.max_stop_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("stop_sequences: at most ", limits_.max_stop_sequences,
                                                   " sequences, got ", req.stop_sequences_size()));
  }
  for (int i = 0; i < req.stop_token_ids_size(); ++i) {
    const int id = req.stop_token_ids(i);
    if (id < 0 || id >= limits_.n_token) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids[", i, "]: ", id, " is outside [0, ", limits_.n_token, ")"));
    }
    spec.stop_token_ids.push_back(id);
  }
  for (int i = 0; i < req.stop_sequences_size(); ++i) {
    if (req.stop_sequences(i).empty())
      return absl::InvalidArgumentError(absl::StrCat("stop_sequences[", i, "]: must not be empty"));
    if (static_cast<int64_t>(req.stop_sequences(i).size()) > limits_.max_stop_sequence_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop_sequences[", i, "]: at most ",
                                                     limits_.max_stop_sequence_bytes, " bytes, got ",
                                                     req.stop_sequences(i).size()));
    }
    spec.stop_sequences.push_back(req.stop_sequences(i));
  }
  if (req.logprobs() < 0 || req.logprobs() > limits_.max_top_logprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs: must be in [0, ", limits_.max_top_logprobs, "], got ", req.logprobs()));
  }
  spec.top_logprobs = req.logprobs();
  CheckedGrammar constraint;
  if (!req.grammar().empty()) {
    ASSIGN_OR_RETURN(constraint, ParseGrammar(req.grammar()));
  }
  if (req.response_format().type() != v1::ResponseFormat::TYPE_TEXT) {
    if (constraint.grammar != nullptr) {
      return absl::InvalidArgumentError("response_format: give it or a grammar, not both (it is written as one)");
    }
    ASSIGN_OR_RETURN(constraint, ResponseFormatGrammar(req.response_format()));
  } else if (!req.response_format().json_schema().empty()) {
    return absl::InvalidArgumentError("response_format.json_schema: only with type TYPE_JSON_SCHEMA");
  }
  spec.grammar = std::move(constraint.grammar);
  spec.masker = std::move(constraint.masker);
  return spec;
}

absl::StatusOr<CheckedGrammar> RequestValidator::ResponseFormatGrammar(const v1::ResponseFormat& format) const {
  std::string text;
  if (format.type() == v1::ResponseFormat::TYPE_JSON_OBJECT) {
    if (!format.json_schema().empty()) {
      return absl::InvalidArgumentError("response_format.json_schema: only with type TYPE_JSON_SCHEMA");
    }
    text = JsonObjectGrammar();
  } else if (format.type() == v1::ResponseFormat::TYPE_JSON_SCHEMA) {
    if (format.json_schema().empty()) return absl::InvalidArgumentError("response_format.json_schema: required");
    absl::StatusOr<std::string> written = JsonSchemaGrammar(format.json_schema());
    if (!written.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("response_format.json_schema: ", written.status().message()));
    }
    text = *std::move(written);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("response_format.type: unknown value ", format.type()));
  }
  // A word-level model's first word is spaced when the prompt ends in a word
  // (Tokenizer::AppendedText): JSON may begin with that blank. The written
  // grammar's first line is its root's one definition.
  if (tokenizer_ != nullptr && tokenizer_->kind() == TokenizerKind::kWord && absl::StartsWith(text, "root ::= ")) {
    text.insert(9, "\" \"? ");
  }
  absl::StatusOr<CheckedGrammar> grammar = ParseGrammar(text);
  if (!grammar.ok()) {
    // ParseGrammar's messages start "grammar: ": the model's vocabulary, or
    // a limit the schema's grammar passed ("grammar: line L, column C: more
    // than 1024 rules ..."), which is the schema's size, not a line of it.
    std::string why(grammar.status().message());
    if (why.rfind("grammar: ", 0) == 0) why = why.substr(9);
    if (why.rfind("line ", 0) == 0) {
      const size_t what = why.find(": ");
      return absl::InvalidArgumentError(
          absl::StrCat("response_format.json_schema: the schema is too large to follow (its grammar has ",
                       what == std::string::npos ? why : why.substr(what + 2), ")"));
    }
    return absl::Status(grammar.status().code(), absl::StrCat("response_format: ", why));
  }
  return grammar;
}

absl::StatusOr<CheckedGrammar> RequestValidator::ParseGrammar(const std::string& text) const {
  if (tokenizer_ == nullptr) return absl::InvalidArgumentError("grammar: no model to check it against");
  if (grammars_ != nullptr && &grammars_->tokenizer() == tokenizer_) return grammars_->Get(text);
  GrammarCacheConfig keep_none;
  keep_none.capacity = 0;
  return GrammarCache(*tokenizer_, keep_none).Get(text);
}

absl::StatusOr<NewSessionArgs> RequestValidator::CreateSession(const v1::CreateSessionRequest& req,
                                                               const std::string* metadata_session_id) const {
  NewSessionArgs args;
  ASSIGN_OR_RETURN(args.mem_len, MemLen(req.mem_len()));
  if (req.idle_ttl_seconds() < 0)
    return absl::InvalidArgumentError(absl::StrCat("idle_ttl_seconds: must be >= 0, got ", req.idle_ttl_seconds()));
  args.idle_ttl = absl::Seconds(req.idle_ttl_seconds());
  ASSIGN_OR_RETURN(args.session_id, ResolveSessionId(req.session_id(), metadata_session_id));
  if (!args.session_id.empty() && !IsSessionIdForm(args.session_id)) {
    return absl::InvalidArgumentError("session_id: must be 32 lowercase hex characters (128 random bits), or empty");
  }
  return args;
}

absl::StatusOr<GenerateArgs> RequestValidator::Generate(const v1::GenerateRequest& req,
                                                        const std::string* metadata_session_id) const {
  GenerateArgs args;
  ASSIGN_OR_RETURN(args.session_id, ResolveSessionId(req.session_id(), metadata_session_id));
  ASSIGN_OR_RETURN(args.spec, Spec(req));
  if (req.n() < 0 || req.n() > limits_.max_n) {
    return absl::InvalidArgumentError(absl::StrCat("n: must be in [1, ", limits_.max_n, "] (0: 1), got ", req.n()));
  }
  args.n = std::max(1, req.n());
  args.best_of = req.best_of() == 0 ? args.n : req.best_of();
  if (args.best_of < args.n || args.best_of > limits_.max_n) {
    return absl::InvalidArgumentError(absl::StrCat("best_of: must be in [n, ", limits_.max_n, "] = [", args.n, ", ",
                                                   limits_.max_n, "] (0: n), got ", req.best_of()));
  }
  if (args.best_of > 1) {
    const char* field = args.n > 1 ? "n" : "best_of";
    if (!args.session_id.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ": several choices need a request without a session: a session has one history, and "
                       "each choice would continue it differently (fork the session once per choice instead)"));
    }
    if (args.spec.echo) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": not with echo (ask for the prompt's log-probs alone)"));
    }
  }
  return args;
}

absl::StatusOr<ScoreArgs> RequestValidator::Score(const v1::ScoreRequest& req,
                                                  const std::string* metadata_session_id) const {
  ScoreArgs args;
  ASSIGN_OR_RETURN(args.session_id, ResolveSessionId(req.session_id(), metadata_session_id));
  ASSIGN_OR_RETURN(args.input, DecodeInput(req.input()));
  if (args.input.empty()) return absl::InvalidArgumentError("input: must hold at least one token");
  return args;
}

absl::Status RequestValidator::Continuation(const GenerateSpec& spec, int64_t session_position) {
  if (spec.input.empty() && session_position == 0) {
    return absl::InvalidArgumentError("input: empty, and the session has no history to continue from");
  }
  return absl::OkStatus();
}

absl::Status RequestValidator::HistoryPosition(int64_t position) {
  if (position < 0) return absl::InvalidArgumentError(absl::StrCat("position: must be >= 0, got ", position));
  return absl::OkStatus();
}

absl::Status RequestValidator::Labels(const std::map<std::string, std::string>& labels) {
  for (const auto& [k, v] : labels) {
    if (absl::StartsWith(k, "txl.")) {
      return absl::InvalidArgumentError(
          absl::StrCat("labels: keys starting with \"txl.\" are the server's, got \"", k, "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace txl
