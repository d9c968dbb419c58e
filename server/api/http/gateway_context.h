// GatewayContext: what every HTTP route shares (the gateway's config, the
// service core, the stub of the in-process gRPC service, metrics, the chat
// records) and the few things each opens or ends with: who is calling,
// passing the caller's credentials on, mapping a status to an HTTP error,
// answering and counting, and one unary gRPC call answered as JSON (Unary).
// Routes include only this.
#ifndef TXL_SERVER_API_HTTP_GATEWAY_CONTEXT_H_
#define TXL_SERVER_API_HTTP_GATEWAY_CONTEXT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "proto/txl/v1/txl.grpc.pb.h"
#include "server/api/http/chat_sessions.h"
#include "server/api/http/chat_template.h"
#include "server/api/http/http_exchange.h"
#include "server/api/http/openai_json.h"
#include "server/core/service_core.h"
#include "server/metrics/service_metrics.h"

namespace txl {

struct OpenAiGatewayConfig {
  std::string model_name;  // the id /v1/models lists and requests may name
  ChatTemplate chat_template;
};

struct GatewayContext {
  OpenAiGatewayConfig config;
  const ServiceCore* core = nullptr;              // the session operations, called directly
  std::unique_ptr<v1::TransformerXL::Stub> stub;  // generation and scoring, still on the in-process channel
  ServiceMetrics* metrics = nullptr;              // may be null
  std::atomic<int>* active = nullptr;             // generations in flight (the gateway's)
  ChatSessions* chats = nullptr;

  // Answers and counts it in txl_http_requests_total{route, code}.
  void Answer(HttpExchange& x, const std::string& route, int status, const std::string& json) const;
  // The caller, from its Authorization header (ServiceCore::Authenticate).
  absl::StatusOr<std::string> Principal(const HttpRequest& req) const;
  // Answers with `s`'s HTTP error (FromStatus).
  void Fail(HttpExchange& x, const std::string& route, const absl::Status& s) const;
  void Count(const std::string& route, int status) const {
    if (metrics != nullptr) metrics->OnHttpRequest(route, status);
  }
};

// The one mapping of a status to an HTTP error (ErrorFromStatus's table).
HttpError FromStatus(const absl::Status& s);
HttpError FromGrpc(const grpc::Status& s);
// The caller's credentials go on to the service as they came.
void CopyAuth(const HttpRequest& req, grpc::ClientContext* ctx);

// One unary call on the service, answered with render(response) as JSON.
// `invoke` starts it on the stub's callback API.
template <typename Req, typename Resp>
void Unary(const GatewayContext* s, std::shared_ptr<HttpExchange> x, std::string route, Req req,
           void (*invoke)(v1::TransformerXL::Stub::async_interface*, grpc::ClientContext*, const Req*, Resp*,
                          std::function<void(grpc::Status)>),
           std::function<nlohmann::json(const Resp&)> render) {
  struct Call {
    grpc::ClientContext ctx;
    Req req;
    Resp resp;
  };
  auto call = std::make_shared<Call>();
  call->req = std::move(req);
  CopyAuth(x->request(), &call->ctx);
  invoke(s->stub->async(), &call->ctx, &call->req, &call->resp,
         [s, x, call, route = std::move(route), render = std::move(render)](grpc::Status status) {
           if (!status.ok()) {
             const HttpError e = FromGrpc(status);
             s->Answer(*x, route, e.status, ErrorBody(e));
             return;
           }
           s->Answer(*x, route, 200, JsonText(render(call->resp)));
         });
}

}  // namespace txl

#endif  // TXL_SERVER_API_HTTP_GATEWAY_CONTEXT_H_
