// What the front ends (gRPC and HTTP) report to metrics. Implemented by Metrics
// (prometheus); tests may pass nothing.
#ifndef TXL_SERVER_METRICS_SERVICE_METRICS_H_
#define TXL_SERVER_METRICS_SERVICE_METRICS_H_

#include <string>

namespace txl {

class ServiceMetrics {
 public:
  virtual ~ServiceMetrics() = default;
  // A gRPC call: `code` is its status code name, e.g. "OK", "NOT_FOUND".
  virtual void OnRequest(const std::string& method, const std::string& code) = 0;
  // An HTTP answer: `route` is the route's pattern (never the raw path, so
  // the label set stays bounded), `status` the HTTP status.
  virtual void OnHttpRequest(const std::string& route, int status) {}
};

}  // namespace txl

#endif  // TXL_SERVER_METRICS_SERVICE_METRICS_H_
