#include "server/http/openai_gateway.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/http/completion_call.h"
#include "server/http/playground/playground_page.h"
#include "server/http/routes.h"

namespace txl {

OpenAiGateway::OpenAiGateway(const OpenAiGatewayConfig& config, const ServiceCore* core, ServiceMetrics* metrics) {
  ctx_.config = config;
  ctx_.core = core;
  ctx_.metrics = metrics;
  ctx_.active = &active_;
  ctx_.chats = &chats_;
}

void OpenAiGateway::Handle(std::shared_ptr<HttpExchange> x) {
  const HttpRequest& req = x->request();
  const std::string& path = req.path;
  auto wrong_method = [&](const std::string& route, const char* allowed) {
    ctx_.Answer(*x, route, 405,
                ErrorBody({405, absl::StrCat(req.method, " is not allowed on ", route, " (use ", allowed, ")"), "",
                           "method_not_allowed"}));
  };
  if (path == "/" || path == "/index.html") {  // the playground; its API calls carry the token
    if (req.method != "GET") return wrong_method("/", "GET");
    ctx_.Count("/", 200);
    return x->Respond(200, "text/html; charset=utf-8", PlaygroundPage());
  }
  // Health: no credentials (as gRPC's health service), so probes need none.
  if (path == "/healthz" || path == "/v2/health/live") {
    if (req.method != "GET") return wrong_method(path, "GET");
    return ctx_.Answer(*x, path, 200, R"({"status":"ok"})");
  }
  if (path == "/readyz" || path == "/v2/health/ready") {
    if (req.method != "GET") return wrong_method(path, "GET");
    if (draining_) return ctx_.Answer(*x, path, 503, R"({"status":"draining"})");
    return ctx_.Answer(*x, path, 200, R"({"status":"ready"})");
  }
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    if (req.method != "GET") return wrong_method("/v1/models", "GET");
    return ModelsRoute(&ctx_, std::move(x), path.size() > 11 ? path.substr(11) : "");
  }
  if (path.rfind("/v2/repository/", 0) == 0) return RepositoryRoute(&ctx_, std::move(x), path.substr(15));
  if (path == "/v1/sessions" || path.rfind("/v1/sessions/", 0) == 0) return SessionsRoute(&ctx_, std::move(x));
  if (path == "/v1/chat/completions") {
    if (req.method != "POST") return wrong_method(path, "POST");
    HttpError error;
    auto params = ParseChat(req.body, req.Header("txl-session-id"), &error);
    if (!params.ok()) return ctx_.Answer(*x, path, error.status, ErrorBody(error));
    return ChatRoute(&ctx_, std::move(x), *std::move(params));
  }
  if (path == "/v1/completions") {
    if (req.method != "POST") return wrong_method(path, "POST");
    HttpError error;
    auto params = ParseCompletion(req.body, req.Header("txl-session-id"), &error);
    if (!params.ok()) return ctx_.Answer(*x, path, error.status, ErrorBody(error));
    StartCompletion(&ctx_, std::move(x), *std::move(params), /*chat=*/false);
    return;
  }
  ctx_.Answer(*x, "other", 404, ErrorBody({404, absl::StrCat("no route ", req.method, " ", path), "", "not_found"}));
}

}  // namespace txl
