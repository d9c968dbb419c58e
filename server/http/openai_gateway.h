// OpenAiGateway: the HTTP routes (OpenAI's shapes, health, models). Each
// route turns its JSON into the request the service core takes, calls the
// core (server/core/service_core.h) with a callback, never waiting, and
// renders what it answers: HTTP has the same scheduler, sessions,
// validation, limits and bearer tokens as gRPC, with no second path to keep
// in step. docs/HTTP.md lists the routes; docs/API_LAYER.md traces one.
#ifndef TXL_SERVER_HTTP_OPENAI_GATEWAY_H_
#define TXL_SERVER_HTTP_OPENAI_GATEWAY_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "server/http/chat_sessions.h"
#include "server/http/gateway_context.h"
#include "server/http/http_exchange.h"
#include "server/metrics/service_metrics.h"

namespace txl {

class OpenAiGateway {
 public:
  // `core`: the service core every route calls; `metrics` may be null.
  OpenAiGateway(const OpenAiGatewayConfig& config, const ServiceCore* core, ServiceMetrics* metrics);
  // The HttpHandler: routes one exchange. Never blocks.
  void Handle(std::shared_ptr<HttpExchange> x);
  // /readyz and /v2/health/ready answer 503 from now on.
  void SetDraining() { draining_ = true; }
  // Calls in flight (generations not yet finished).
  int active() const { return active_.load(); }

 private:
  ChatSessions chats_;
  GatewayContext ctx_;
  std::atomic<bool> draining_{false};
  std::atomic<int> active_{0};
};

}  // namespace txl

#endif  // TXL_SERVER_HTTP_OPENAI_GATEWAY_H_
