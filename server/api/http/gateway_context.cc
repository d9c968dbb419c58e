#include "server/api/http/gateway_context.h"

namespace txl {

void GatewayContext::Answer(HttpExchange& x, const std::string& route, int status, const std::string& json) const {
  Count(route, status);
  x.Respond(status, "application/json", json);
}

HttpError FromGrpc(const grpc::Status& s) {
  return ErrorFromStatus(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void CopyAuth(const HttpRequest& req, grpc::ClientContext* ctx) {
  const std::string auth = req.Header("authorization");
  if (!auth.empty()) ctx->AddMetadata("authorization", auth);
}

}  // namespace txl
