#include "server/http/gateway_context.h"

namespace txl {

void GatewayContext::Answer(HttpExchange& x, const std::string& route, int status, const std::string& json) const {
  Count(route, status);
  x.Respond(status, "application/json", json);
}

absl::StatusOr<std::string> GatewayContext::Principal(const HttpRequest& req) const {
  const std::string auth = req.Header("authorization");
  return core->Authenticate(auth.empty() ? std::nullopt : std::optional<absl::string_view>(auth));
}

void GatewayContext::Fail(HttpExchange& x, const std::string& route, const absl::Status& s,
                          const FieldNames& names) const {
  const HttpError e = FromStatus(s, names);
  Answer(x, route, e.status, ErrorBody(e));
}

HttpError FromStatus(const absl::Status& s, const FieldNames& names) {
  return ErrorFromStatus(s.code(), std::string(s.message()), names);
}

}  // namespace txl
