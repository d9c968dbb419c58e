#include <utility>

#include "server/http/completion_call.h"
#include "server/http/routes.h"

namespace txl {

// POST /v1/chat/completions: the messages rendered by the chat template; with
// a session, only those it has not seen (ChatSessions::Plan, which needs the
// session's position: the core's GetSession first).
void ChatRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x, ChatParams p) {
  const std::string route = "/v1/chat/completions";
  const ChatTemplate& t = s->config.chat_template;
  if (p.completion.request.stop_sequences().empty()) {
    for (const std::string& stop : t.stop) p.completion.request.add_stop_sequences(stop);
  }
  auto start = [s, route](std::shared_ptr<HttpExchange> x, ChatParams p, std::string feed) {
    p.completion.request.mutable_input()->set_text(std::move(feed));
    const std::string session = p.completion.request.session_id();
    std::function<void(const CompletionResult&)> record;
    if (!session.empty()) {
      record = [s, session, messages = p.messages](const CompletionResult& r) {
        s->chats->Record(session, messages, r.choices.front().text, r.position);  // a session's: one choice
      };
    }
    StartCompletion(s, std::move(x), std::move(p.completion), /*chat=*/true, std::move(record));
  };
  const std::string session = p.completion.request.session_id();
  if (session.empty()) {
    std::string feed;
    for (const ChatMessage& m : p.messages) feed += t.Render(m);
    return start(std::move(x), std::move(p), feed + t.generation_prompt);
  }
  auto principal = s->Principal(x->request());
  if (!principal.ok()) return s->Fail(*x, route, principal.status());
  s->core->GetSession(
      *principal, session, [s, x, route, start, p = std::move(p)](absl::StatusOr<SessionInfo> info) mutable {
        if (!info.ok()) return s->Fail(*x, route, info.status());
        HttpError error;
        auto feed = s->chats->Plan(info->id, info->position, p.messages, s->config.chat_template, &error);
        if (!feed.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
        start(x, std::move(p), *std::move(feed));
      });
}

}  // namespace txl
