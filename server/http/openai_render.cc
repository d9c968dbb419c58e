// The OpenAI-style JSON the HTTP routes send (openai_json.h): completion and
// chat bodies, their stream chunks and usage events, sessions and scores.
// Responses only; the requests' parsing is openai_json.cc.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/http/openai_json.h"

namespace txl {
namespace {

using json = nlohmann::json;

json Identity(const CompletionId& id) {
  return json{{"id", id.id}, {"object", "text_completion"}, {"created", id.created}, {"model", id.model}};
}

}  // namespace

void CompletionResult::Add(const v1::GenerateResponse& r) {
  // The service numbers choices from 0 up to the request's n (at most --max_n).
  const size_t index = static_cast<size_t>(std::max(0, r.index()));
  if (choices.size() <= index) choices.resize(index + 1);
  CompletionChoice& c = choices[index];
  c.text += r.text();
  for (const auto& t : r.tokens()) c.tokens.push_back(t);
  for (const auto& t : r.echo()) c.echo.push_back(t);
  if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) c.finish = r.finish_reason();
  if (r.has_usage()) usage = r.usage();
  position = r.position();
  if (!r.session_id().empty() && stateful) session_id = r.session_id();
}

json FinishReasonJson(v1::FinishReason f) {
  switch (f) {
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_STOP_TOKEN:
    case v1::FINISH_REASON_STOP_SEQUENCE: return "stop";
    case v1::FINISH_REASON_CANCELLED: return "cancelled";
    default: return nullptr;
  }
}

json LogprobsJson(const std::vector<v1::ScoredToken>& echo, const std::vector<v1::GeneratedToken>& tokens,
                  int64_t offset) {
  json texts = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& t : echo) {  // the prompt's: no alternatives
    texts.push_back(t.text());
    lps.push_back(t.has_logprob() ? json(t.logprob()) : json(nullptr));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(t.text().size());
    tops.push_back(nullptr);
  }
  for (const auto& t : tokens) {
    texts.push_back(t.text());
    lps.push_back(t.logprob());
    offsets.push_back(offset);
    offset += static_cast<int64_t>(t.text().size());
    json top = json::object();
    for (const auto& alt : t.top())
      top[alt.text().empty() ? absl::StrCat("<", alt.id(), ">") : alt.text()] = alt.logprob();
    tops.push_back(t.top().empty() ? json(nullptr) : top);
  }
  return json{{"tokens", texts}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

std::string EchoText(const std::vector<v1::ScoredToken>& echo) {
  std::string text;
  for (const auto& t : echo) text += t.text();
  return text;
}

std::string CompletionBody(const CompletionId& id, const CompletionResult& r, bool logprobs) {
  json choices = json::array();
  for (size_t i = 0; i < r.choices.size(); ++i) {
    const CompletionChoice& c = r.choices[i];
    choices.push_back({{"text", c.echo_text + c.text},
                       {"index", i},
                       {"logprobs", logprobs ? LogprobsJson(c.echo, c.tokens, 0) : json(nullptr)},
                       {"finish_reason", FinishReasonJson(c.finish)}});
  }
  json out = Identity(id);
  out["choices"] = std::move(choices);
  out["usage"] = json{{"prompt_tokens", r.usage.input_tokens()},
                      {"completion_tokens", r.usage.generated_tokens()},
                      {"total_tokens", r.usage.input_tokens() + r.usage.generated_tokens()}};
  if (!r.session_id.empty()) {
    out["session_id"] = r.session_id;
    out["position"] = r.position;
  }
  return JsonText(out);
}

std::string CompletionChunk(const CompletionId& id, const v1::GenerateResponse& r, bool logprobs, int64_t offset,
                            const std::string& session, const std::string& echo_text) {
  std::vector<v1::GeneratedToken> tokens(r.tokens().begin(), r.tokens().end());
  std::vector<v1::ScoredToken> echo(r.echo().begin(), r.echo().end());
  const bool any = !tokens.empty() || !echo.empty();
  json choice{{"text", echo_text + r.text()},
              {"index", r.index()},
              {"logprobs", logprobs && any ? LogprobsJson(echo, tokens, offset) : json(nullptr)},
              {"finish_reason", FinishReasonJson(r.finish_reason())}};
  json out = Identity(id);
  out["choices"] = json::array({choice});
  if (!session.empty()) {
    out["session_id"] = session;
    out["position"] = r.position();
  }
  return absl::StrCat("data: ", JsonText(out), "\n\n");
}

std::string UsageChunk(const CompletionId& id, const v1::Usage& usage, int64_t position, const std::string& session) {
  json out = Identity(id);
  out["choices"] = json::array();
  out["usage"] = json{{"prompt_tokens", usage.input_tokens()},
                      {"completion_tokens", usage.generated_tokens()},
                      {"total_tokens", usage.input_tokens() + usage.generated_tokens()}};
  if (!session.empty()) {
    out["session_id"] = session;
    out["position"] = position;
  }
  return absl::StrCat("data: ", JsonText(out), "\n\n");
}

json SessionJson(const SessionInfo& s) {
  json labels = json::object();
  for (const auto& [k, v] : s.labels) labels[k] = v;
  return json{{"id", s.id},
              {"object", "session"},
              {"position", s.position},
              {"mem_len", s.mem_len},
              {"memory_tokens", s.memory_tokens},
              {"memory_bytes", s.memory_bytes},
              {"created", absl::ToUnixSeconds(s.created)},
              {"last_used", absl::ToUnixSeconds(s.last_used)},
              {"idle_ttl_seconds", absl::ToInt64Seconds(s.idle_ttl)},
              {"labels", labels},
              {"busy", s.busy},
              {"model", s.model}};
}

namespace {

json Usage(const v1::Usage& usage) {
  return json{{"prompt_tokens", usage.input_tokens()},
              {"completion_tokens", usage.generated_tokens()},
              {"total_tokens", usage.input_tokens() + usage.generated_tokens()}};
}

json ChatIdentity(const CompletionId& id, const char* object) {
  return json{{"id", id.id}, {"object", object}, {"created", id.created}, {"model", id.model}};
}

// OpenAI's chat log-probs: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
json ChatLogprobs(const std::vector<v1::GeneratedToken>& tokens) {
  auto bytes = [](const std::string& t) {
    json b = json::array();
    for (unsigned char c : t) b.push_back(static_cast<int>(c));
    return b;
  };
  json content = json::array();
  for (const auto& t : tokens) {
    json top = json::array();
    for (const auto& alt : t.top()) {
      top.push_back({{"token", alt.text()}, {"logprob", alt.logprob()}, {"bytes", bytes(alt.text())}});
    }
    content.push_back(
        {{"token", t.text()}, {"logprob", t.logprob()}, {"bytes", bytes(t.text())}, {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

}  // namespace

std::string ChatBody(const CompletionId& id, const CompletionResult& r, bool logprobs) {
  json choices = json::array();
  for (size_t i = 0; i < r.choices.size(); ++i) {
    const CompletionChoice& c = r.choices[i];
    choices.push_back({{"index", i},
                       {"message", {{"role", "assistant"}, {"content", c.text}}},
                       {"logprobs", logprobs ? ChatLogprobs(c.tokens) : json(nullptr)},
                       {"finish_reason", FinishReasonJson(c.finish)}});
  }
  json out = ChatIdentity(id, "chat.completion");
  out["choices"] = std::move(choices);
  out["usage"] = Usage(r.usage);
  if (!r.session_id.empty()) {
    out["session_id"] = r.session_id;
    out["position"] = r.position;
  }
  return JsonText(out);
}

std::string ChatChunk(const CompletionId& id, const v1::GenerateResponse& r, bool logprobs, bool first,
                      const std::string& session) {
  std::vector<v1::GeneratedToken> tokens(r.tokens().begin(), r.tokens().end());
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  if (!r.text().empty() || first) delta["content"] = r.text();
  json choice{{"index", r.index()},
              {"delta", delta},
              {"logprobs", logprobs && !tokens.empty() ? ChatLogprobs(tokens) : json(nullptr)},
              {"finish_reason", FinishReasonJson(r.finish_reason())}};
  json out = ChatIdentity(id, "chat.completion.chunk");
  out["choices"] = json::array({choice});
  if (!session.empty()) {
    out["session_id"] = session;
    out["position"] = r.position();
  }
  return absl::StrCat("data: ", JsonText(out), "\n\n");
}

std::string ChatUsageChunk(const CompletionId& id, const v1::Usage& usage, int64_t position,
                           const std::string& session) {
  json out = ChatIdentity(id, "chat.completion.chunk");
  out["choices"] = json::array();
  out["usage"] = Usage(usage);
  if (!session.empty()) {
    out["session_id"] = session;
    out["position"] = position;
  }
  return absl::StrCat("data: ", JsonText(out), "\n\n");
}

json ScoreJson(const std::string& session, const v1::ScoreResponse& r) {
  json tokens = json::array();
  for (const auto& t : r.tokens()) {
    tokens.push_back(
        {{"id", t.id()}, {"text", t.text()}, {"logprob", t.has_logprob() ? json(t.logprob()) : json(nullptr)}});
  }
  return json{{"object", "session.score"},
              {"session_id", session},
              {"tokens", tokens},
              {"total_logprob", r.total_logprob()},
              {"position", r.position()}};
}

}  // namespace txl
