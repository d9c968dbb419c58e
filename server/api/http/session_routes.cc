#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/api/http/routes.h"

namespace txl {

using json = nlohmann::json;

// /v1/sessions[/ID[/fork]]: the session calls of the gRPC API, same semantics.
void SessionsRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x) {
  const HttpRequest& req = x->request();
  const std::string rest =
      req.path.substr(std::string("/v1/sessions").size());  // "", "/ID" or "/ID/fork" (score, rewind)
  const std::vector<std::string> parts = absl::StrSplit(rest, '/', absl::SkipEmpty());
  // A metric label: only the routes that exist (a client's path must not make new series).
  const bool action = parts.size() == 2 && (parts[1] == "fork" || parts[1] == "score" || parts[1] == "rewind");
  const std::string route = parts.empty()       ? "/v1/sessions"
                            : parts.size() == 1 ? "/v1/sessions/{id}"
                            : action            ? absl::StrCat("/v1/sessions/{id}/", parts[1])
                                                : "other";
  auto wrong_method = [&](const char* allowed) {
    s->Answer(*x, route, 405,
              ErrorBody({405, absl::StrCat(req.method, " is not allowed on ", route, " (use ", allowed, ")"), "",
                         "method_not_allowed"}));
  };
  auto session = [](const v1::Session& r) { return SessionJson(r); };
  HttpError error;
  if (parts.empty()) {
    if (req.method == "POST") {
      auto create = ParseCreateSession(req.body, &error);
      if (!create.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
      return Unary<v1::CreateSessionRequest, v1::Session>(
          s, std::move(x), route, *std::move(create),
          [](auto* a, auto* c, auto* q, auto* o, auto f) { a->CreateSession(c, q, o, std::move(f)); }, session);
    }
    if (req.method == "GET") {
      return Unary<v1::ListSessionsRequest, v1::ListSessionsResponse>(
          s, std::move(x), route, {},
          [](auto* a, auto* c, auto* q, auto* o, auto f) { a->ListSessions(c, q, o, std::move(f)); },
          [](const v1::ListSessionsResponse& r) {
            json data = json::array();
            for (const auto& one : r.sessions()) data.push_back(SessionJson(one));
            return json{{"object", "list"}, {"data", data}};
          });
    }
    return wrong_method("GET or POST");
  }
  const std::string& id = parts[0];
  if (parts.size() == 1) {
    if (req.method == "GET") {
      v1::GetSessionRequest q;
      q.set_session_id(id);
      return Unary<v1::GetSessionRequest, v1::Session>(
          s, std::move(x), route, q,
          [](auto* a, auto* c, auto* q, auto* o, auto f) { a->GetSession(c, q, o, std::move(f)); }, session);
    }
    if (req.method == "DELETE") {
      v1::DeleteSessionRequest q;
      q.set_session_id(id);
      return Unary<v1::DeleteSessionRequest, v1::DeleteSessionResponse>(
          s, std::move(x), route, q,
          [](auto* a, auto* c, auto* q, auto* o, auto f) { a->DeleteSession(c, q, o, std::move(f)); },
          [s, id](const v1::DeleteSessionResponse&) {
            s->chats->Forget(id);
            return json{{"id", id}, {"object", "session"}, {"deleted", true}};
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
    v1::ForkSessionRequest q;
    q.set_session_id(id);
    *q.mutable_labels() = body->labels();
    q.set_position(*position);
    return Unary<v1::ForkSessionRequest, v1::Session>(
        s, std::move(x), route, q,
        [](auto* a, auto* c, auto* q, auto* o, auto f) { a->ForkSession(c, q, o, std::move(f)); },
        [s, id, at = *position](const v1::Session& r) {
          // A fork at an earlier position has not seen the source's later messages.
          if (at == 0) s->chats->Copy(id, r.session_id());
          return SessionJson(r);
        });
  }
  if (parts.size() == 2 && parts[1] == "rewind") {
    if (req.method != "POST") return wrong_method("POST");
    auto position = ParsePosition(req.body, /*required=*/true, &error);
    if (!position.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
    v1::RewindSessionRequest q;
    q.set_session_id(id);
    q.set_position(*position);
    return Unary<v1::RewindSessionRequest, v1::Session>(
        s, std::move(x), route, q,
        [](auto* a, auto* c, auto* q, auto* o, auto f) { a->RewindSession(c, q, o, std::move(f)); },
        [s, id](const v1::Session& r) {
          s->chats->Forget(id);  // the messages it saw may be gone: chat falls back to what it is sent
          return SessionJson(r);
        });
  }
  if (parts.size() == 2 && parts[1] == "score") {
    if (req.method != "POST") return wrong_method("POST");
    auto score = ParseScore(req.body, id, &error);
    if (!score.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
    return Unary<v1::ScoreRequest, v1::ScoreResponse>(
        s, std::move(x), route, *std::move(score),
        [](auto* a, auto* c, auto* q, auto* o, auto f) { a->Score(c, q, o, std::move(f)); },
        [id](const v1::ScoreResponse& r) { return ScoreJson(id, r); });
  }
  s->Answer(*x, "other", 404, ErrorBody({404, absl::StrCat("no route ", req.method, " ", req.path), "", "not_found"}));
}

}  // namespace txl
