// The routes with more than a line to them (openai_gateway.cc dispatches):
// each turns one request into calls on the service core.
#ifndef TXL_SERVER_HTTP_ROUTES_H_
#define TXL_SERVER_HTTP_ROUTES_H_

#include <memory>
#include <string>

#include "server/http/gateway_context.h"

namespace txl {

// GET /v1/models[/ID].
void ModelsRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x, const std::string& id);
// POST /v2/repository/index, /v2/repository/models/NAME/{load,unload}; `rest`
// is the path after "/v2/repository/".
void RepositoryRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x, const std::string& rest);
// /v1/sessions[/ID[/fork|/score]].
void SessionsRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x);
// POST /v1/chat/completions, parsed.
void ChatRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x, ChatParams p);

}  // namespace txl

#endif  // TXL_SERVER_HTTP_ROUTES_H_
