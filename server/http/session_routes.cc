#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/http/routes.h"

#include "server/core/responses.h"

namespace txl {

using json = nlohmann::json;

// /v1/sessions[/ID[/fork|rewind|score]]: the session operations and scoring of
// the service core (the gRPC API's, same semantics).
void SessionsRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x) {
  const HttpRequest& req = x->request();
  const std::string rest =
      req.path.substr(std::string("/v1/sessions").size());  // "", "/ID" or "/ID/fork" (score, rewind)
  const std::vector<std::string> parts = absl::StrSplit(rest, '/', absl::SkipEmpty());
  // A metric label: only the routes that exist (a client's path must not make new series).
  const bool action =
      parts.size() == 2 && (parts[1] == "fork" || parts[1] == "score" || parts[1] == "rewind" || parts[1] == "migrate");
  const std::string route = parts.empty()       ? "/v1/sessions"
                            : parts.size() == 1 ? "/v1/sessions/{id}"
                            : action            ? absl::StrCat("/v1/sessions/{id}/", parts[1])
                                                : "other";
  auto wrong_method = [&](const char* allowed) {
    s->Answer(*x, route, 405,
              ErrorBody({405, absl::StrCat(req.method, " is not allowed on ", route, " (use ", allowed, ")"), "",
                         "method_not_allowed"}));
  };
  auto principal = s->Principal(req);
  if (!principal.ok()) return s->Fail(*x, route, principal.status());
  // Answers with the session, after `then` (the chat records' bookkeeping).
  auto answer_session = [s, x, route](std::function<void(const SessionInfo&)> then = nullptr) -> SessionDone {
    return [s, x, route, then](absl::StatusOr<SessionInfo> info) {
      if (!info.ok()) return s->Fail(*x, route, info.status());
      if (then) then(*info);
      s->Answer(*x, route, 200, JsonText(SessionJson(*info)));
    };
  };
  HttpError error;
  if (parts.empty()) {
    if (req.method == "POST") {
      auto create = ParseCreateSession(req.body, &error);
      if (!create.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
      auto args = s->core->CheckCreateSession(*create, nullptr);
      if (!args.ok()) return s->Fail(*x, route, args.status());
      return s->core->CreateSession(*principal, *std::move(args), {create->labels().begin(), create->labels().end()},
                                    answer_session());
    }
    if (req.method == "GET") {
      json data = json::array();
      for (const SessionInfo& one : s->core->ListSessions(*principal)) data.push_back(SessionJson(one));
      return s->Answer(*x, route, 200, JsonText(json{{"object", "list"}, {"data", data}}));
    }
    return wrong_method("GET or POST");
  }
  const std::string& id = parts[0];
  if (parts.size() == 1) {
    if (req.method == "GET") return s->core->GetSession(*principal, id, answer_session());
    if (req.method == "DELETE") {
      return s->core->DeleteSession(*principal, id, [s, x, route, id](absl::Status deleted) {
        if (!deleted.ok()) return s->Fail(*x, route, deleted);
        s->chats->Forget(id);
        s->Answer(*x, route, 200, JsonText(json{{"id", id}, {"object", "session"}, {"deleted", true}}));
      });
    }
    return wrong_method("GET or DELETE");
  }
  if (parts.size() == 2 && parts[1] == "fork") {
    if (req.method != "POST") return wrong_method("POST");
    auto body = ParseCreateSession(req.body, &error);
    if (!body.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
    auto position = ParsePosition(req.body, /*required=*/false, &error);
    if (!position.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
    return s->core->ForkSession(*principal, id, *position, {body->labels().begin(), body->labels().end()},
                                answer_session([s, id, at = *position](const SessionInfo& fork) {
                                  // A fork at an earlier position has not seen the source's later messages.
                                  if (at == 0) s->chats->Copy(id, fork.id);
                                }));
  }
  if (parts.size() == 2 && parts[1] == "rewind") {
    if (req.method != "POST") return wrong_method("POST");
    auto position = ParsePosition(req.body, /*required=*/true, &error);
    if (!position.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
    return s->core->RewindSession(*principal, id, *position, answer_session([s, id](const SessionInfo&) {
      s->chats->Forget(id);  // the messages it saw may be gone: chat falls back to what it is sent
    }));
  }
  if (parts.size() == 2 && parts[1] == "migrate") {  // {"model": NAME[@VERSION]}
    if (req.method != "POST") return wrong_method("POST");
    auto body = ParseCreateSession(req.body, &error);
    if (!body.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
    return s->core->MigrateSession(*principal, id, body->model(), answer_session());
  }
  if (parts.size() == 2 && parts[1] == "score") {
    if (req.method != "POST") return wrong_method("POST");
    auto score = ParseScore(req.body, id, &error);
    if (!score.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
    auto args = s->core->CheckScore(*principal, *score, nullptr);
    if (!args.ok()) return s->Fail(*x, route, args.status());
    const std::shared_ptr<ServedModel> model = args->model;
    return s->core->Score(*principal, *std::move(args), score->commit(), s->core->NewJobControl(),
                          [s, x, route, id, model](absl::Status scored, ScoreResult result) {
                            if (!scored.ok()) return s->Fail(*x, route, scored);
                            v1::ScoreResponse r;
                            FillScore(result, model->tokenizer(), &r);
                            s->Answer(*x, route, 200, JsonText(ScoreJson(id, r)));
                          });
  }
  s->Answer(*x, "other", 404, ErrorBody({404, absl::StrCat("no route ", req.method, " ", req.path), "", "not_found"}));
}

}  // namespace txl
