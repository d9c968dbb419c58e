// GatewayContext: what every HTTP route shares (the gateway's config, the
// service core, metrics, the chat records) and the few things each opens or
// ends with: who is calling, mapping a status to an HTTP error, answering and
// counting. Routes include only this.
#ifndef TXL_SERVER_HTTP_GATEWAY_CONTEXT_H_
#define TXL_SERVER_HTTP_GATEWAY_CONTEXT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "server/core/service_core.h"
#include "server/http/chat_sessions.h"
#include "server/http/chat_template.h"
#include "server/http/http_exchange.h"
#include "server/http/openai_json.h"
#include "server/metrics/service_metrics.h"

namespace txl {

struct OpenAiGatewayConfig {
  ChatTemplate chat_template;
};

struct GatewayContext {
  OpenAiGatewayConfig config;
  const ServiceCore* core = nullptr;   // the session operations, called directly
  ServiceMetrics* metrics = nullptr;   // may be null
  std::atomic<int>* active = nullptr;  // generations in flight (the gateway's)
  ChatSessions* chats = nullptr;

  // Answers and counts it in txl_http_requests_total{route, code}.
  void Answer(HttpExchange& x, const std::string& route, int status, const std::string& json) const;
  // The caller, from its Authorization header (ServiceCore::Authenticate).
  absl::StatusOr<std::string> Principal(const HttpRequest& req) const;
  // Answers with `s`'s HTTP error (FromStatus); `names`: how the request names the fields a
  // refusal may name.
  void Fail(HttpExchange& x, const std::string& route, const absl::Status& s,
            const FieldNames& names = SessionFieldNames()) const;
  void Count(const std::string& route, int status) const {
    if (metrics != nullptr) metrics->OnHttpRequest(route, status);
  }
};

// The one mapping of a status to an HTTP error (ErrorFromStatus's table).
HttpError FromStatus(const absl::Status& s, const FieldNames& names = SessionFieldNames());

}  // namespace txl

#endif  // TXL_SERVER_HTTP_GATEWAY_CONTEXT_H_
