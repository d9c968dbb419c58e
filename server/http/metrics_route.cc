#include "server/http/metrics_route.h"

#include <utility>

namespace txl {

HttpHandler MetricsRoute(std::function<std::string()> scrape) {
  return [scrape = std::move(scrape)](std::shared_ptr<HttpExchange> x) {
    const HttpRequest& req = x->request();
    if (req.path != "/metrics") return x->Respond(404, "text/plain", "only /metrics is served here\n");
    if (req.method != "GET" && req.method != "HEAD") return x->Respond(405, "text/plain", "use GET\n");
    x->Respond(200, "text/plain; version=0.0.4; charset=utf-8", scrape());
  };
}

}  // namespace txl
