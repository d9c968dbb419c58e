// MetricsEndpoint: serves the Prometheus text exposition over plain HTTP on
// its own port. prometheus-cpp's own Exposer (civetweb) fails to start in a
// process that has libtorch loaded (Debian 12: "null context when
// constructing CivetServer"), so this small listener takes its place; the
// metrics themselves and their serialization are still prometheus-cpp's.
//
// Threading: one accept thread, started by Create and joined by the
// destructor. `render` is called on that thread and must be thread-safe.
#ifndef TXL_SERVER_METRICS_METRICS_ENDPOINT_H_
#define TXL_SERVER_METRICS_METRICS_ENDPOINT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace txl {

class MetricsEndpoint {
 public:
  // `listen` is HOST:PORT (an IPv4 address or "localhost"); port 0 picks one.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Create(const std::string& listen,
                                                                 std::function<std::string()> render);
  ~MetricsEndpoint();

  int port() const { return port_; }

 private:
  MetricsEndpoint(int fd, int port, std::function<std::string()> render);
  void Serve();

  const int fd_;
  const int port_;
  std::function<std::string()> render_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace txl

#endif  // TXL_SERVER_METRICS_METRICS_ENDPOINT_H_
