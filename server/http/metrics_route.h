// The Prometheus scrape route: GET /metrics on its own HttpServer
// (--metrics_listen), with the text Metrics::Scrape renders. It replaced a
// hand-written listener, which existed because prometheus-cpp's civetweb
// exposer would not start beside libtorch (docs/OPERATIONS.md, "Metrics").
#ifndef TXL_SERVER_HTTP_METRICS_ROUTE_H_
#define TXL_SERVER_HTTP_METRICS_ROUTE_H_

#include <functional>
#include <string>

#include "server/http/http_exchange.h"

namespace txl {

HttpHandler MetricsRoute(std::function<std::string()> scrape);

}  // namespace txl

#endif  // TXL_SERVER_HTTP_METRICS_ROUTE_H_
