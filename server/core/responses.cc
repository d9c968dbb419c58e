#include "server/core/responses.h"

#include <string>
#include <utility>
#include <vector>

#include "google/protobuf/util/time_util.h"
#include "server/sampling/text_stream.h"

namespace txl {
namespace {

google::protobuf::Timestamp ToProto(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

v1::FinishReason ToProto(Finish f) {
  switch (f) {
    case Finish::kLength: return v1::FINISH_REASON_LENGTH;
    case Finish::kStopToken: return v1::FINISH_REASON_STOP_TOKEN;
    case Finish::kStopSequence: return v1::FINISH_REASON_STOP_SEQUENCE;
    case Finish::kCancelled: return v1::FINISH_REASON_CANCELLED;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// A token's text, when it is whole UTF-8.
bool WholeUtf8(absl::StatusOr<std::string> t, std::string* text) {
  if (!t.ok() || !IsValidUtf8(*t)) return false;
  *text = *std::move(t);
  return true;
}
bool WholeText(const Tokenizer& tokenizer, int id, std::string* text) {
  return WholeUtf8(tokenizer.TokenText(id), text);
}
// The text the token adds after what came before (at word level, a word
// after a word is spaced).
bool WholeAppendedText(const Tokenizer& tokenizer, int id, bool after_word, std::string* text) {
  return WholeUtf8(tokenizer.AppendedText(id, &after_word), text);
}

void FillScored(const ScoredTokenResult& t, const Tokenizer& tokenizer, v1::ScoredToken* token) {
  token->set_id(t.id);
  std::string text;
  if (WholeText(tokenizer, t.id, &text)) token->set_text(std::move(text));
  token->set_has_logprob(t.has_logprob);
  if (t.has_logprob) token->set_logprob(t.logprob);
}

// An echoed input: each token's text is the whole characters it completes
// (a byte-level model's split character goes with its last byte), so the
// texts join into the input's text, as generated tokens' texts join into the
// output.
void FillEcho(const std::vector<ScoredTokenResult>& echo, const Tokenizer& tokenizer,
              google::protobuf::RepeatedPtrField<v1::ScoredToken>* out) {
  Utf8Stream text;
  bool after_word = false;  // the input's text as Decode writes it
  for (size_t i = 0; i < echo.size(); ++i) {
    v1::ScoredToken* token = out->Add();
    FillScored(echo[i], tokenizer, token);
    auto bytes = tokenizer.AppendedText(echo[i].id, &after_word);
    std::string whole = text.Push(bytes.ok() ? *bytes : std::string());
    if (i + 1 == echo.size()) whole += text.Flush();
    token->set_text(std::move(whole));
  }
}

}  // namespace

v1::GenerateResponse TokensResponse(const std::vector<GeneratedTokenEvent>& events, int64_t position,
                                    const Tokenizer& tokenizer) {
  v1::GenerateResponse r;
  for (const GeneratedTokenEvent& e : events) {
    FillEcho(e.echo, tokenizer, r.mutable_echo());
    v1::GeneratedToken* t = r.add_tokens();
    t->set_id(e.id);
    t->set_text(e.text);
    t->set_logprob(e.logprob);
    r.mutable_text()->append(e.text);
    for (const auto& [id, lp] : e.top) {
      v1::TokenLogprob* alt = t->add_top();
      alt->set_id(id);
      alt->set_logprob(lp);
      std::string text;
      if (WholeAppendedText(tokenizer, id, e.after_word, &text)) alt->set_text(std::move(text));
    }
  }
  r.set_position(position);
  if (!events.empty()) r.set_index(events.front().choice);  // a batch is one choice's
  return r;
}

namespace {

void FillUsage(const GenerateResult& result, v1::Usage* u) {
  u->set_input_tokens(result.input_tokens);
  u->set_generated_tokens(result.generated_tokens);
  u->set_queue_seconds(result.times.queue_seconds);
  u->set_time_to_first_token_seconds(result.times.first_token_seconds);
  u->set_total_seconds(result.times.total_seconds);
}

}  // namespace

v1::GenerateResponse FinalResponse(const GenerateResult& result, const Tokenizer& tokenizer) {
  v1::GenerateResponse r;
  FillEcho(result.echo, tokenizer, r.mutable_echo());
  r.set_text(result.trailing_text);
  r.set_position(result.position);
  r.set_finish_reason(ToProto(result.finish));
  r.set_session_id(result.session_id);
  FillUsage(result, r.mutable_usage());
  return r;
}

std::vector<v1::GenerateResponse> FinalResponses(const GenerateResult& result, const Tokenizer& tokenizer) {
  if (result.choices.empty()) return {FinalResponse(result, tokenizer)};
  std::vector<v1::GenerateResponse> out;
  for (const ChoiceEnd& c : result.choices) {
    if (!c.sent) out.push_back(ChoiceEndResponse(c));
  }
  FillUsage(result, out.back().mutable_usage());  // the call's, in its last response
  return out;
}

v1::GenerateResponse ChoiceEndResponse(const ChoiceEnd& c) {
  v1::GenerateResponse r;
  r.set_index(c.index);
  r.set_text(c.trailing_text);
  r.set_position(c.position);
  r.set_finish_reason(ToProto(c.finish));
  return r;
}

void FillScore(const ScoreResult& result, const Tokenizer& tokenizer, v1::ScoreResponse* out) {
  double total = 0;
  for (const ScoredTokenResult& t : result.scores) {
    FillScored(t, tokenizer, out->add_tokens());
    if (t.has_logprob) total += t.logprob;
  }
  out->set_total_logprob(total);
  out->set_position(result.position);
}

void FillSession(const SessionInfo& info, v1::Session* out) {
  out->set_session_id(info.id);
  out->set_position(info.position);
  out->set_mem_len(info.mem_len);
  out->set_memory_tokens(info.memory_tokens);
  out->set_memory_bytes(info.memory_bytes);
  *out->mutable_created() = ToProto(info.created);
  *out->mutable_last_used() = ToProto(info.last_used);
  out->set_idle_ttl_seconds(absl::ToInt64Seconds(info.idle_ttl));
  for (const auto& [k, v] : info.labels) (*out->mutable_labels())[k] = v;
  out->set_busy(info.busy);
  out->set_model(info.model);
}

void FillModelInfo(const ServiceCore& core, const ServedModel& served, v1::ModelInfo* out) {
  const ServiceConfig& config = core.config;
  const RequestLimits limits = core.Limits(&served);
  const ModelConfig& m = served.config();
  out->set_name(served.name());
  out->set_version(served.version());
  out->set_n_token(m.n_token);
  out->set_n_layer(m.n_layer);
  out->set_n_head(m.n_head);
  out->set_d_model(m.d_model);
  out->set_d_head(m.d_head);
  out->set_d_inner(m.d_inner);
  out->set_d_embed(m.embed_dim());
  out->set_div_val(m.div_val);
  for (int64_t cutoff : m.cutoffs) out->add_cutoffs(cutoff);
  out->set_pre_lnorm(m.pre_lnorm);
  out->set_clamp_len(m.clamp_len);
  const TokenizerKind k = served.tokenizer().kind();
  out->set_tokenizer(k == TokenizerKind::kByte ? "byte" : k == TokenizerKind::kChar ? "char" : "word");
  out->set_vocab_size(served.tokenizer().vocab_size());
  out->set_default_mem_len(limits.default_mem_len);
  out->set_max_mem_len(limits.max_mem_len);
  out->set_max_new_tokens(limits.max_new_tokens);
  out->set_max_input_tokens(limits.max_input_tokens);
  out->set_max_sessions(core.MaxSessions(served));
  out->set_device(config.device);
  out->set_dtype(config.dtype);
  out->set_kv_dtype(config.kv_dtype);
  out->set_cpu_family(config.cpu_family);
  out->set_model_path(served.path().empty() ? config.model_path : served.path());
  out->set_fingerprint(served.engine()->fingerprint());
}

}  // namespace txl
