// HttpServer: the HTTP/1.1 transport (Boost.Beast over Asio), asynchronous on
// a few threads of its own. It parses requests (Beast's parser: none written
// here), applies the transport's limits and CORS, and hands each request to
// one HttpHandler as an HttpExchange. It knows no routes. docs/API_LAYER.md,
// "The HTTP front end", says why Beast and how a request flows.
#ifndef TXL_SERVER_HTTP_HTTP_SERVER_H_
#define TXL_SERVER_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/http/http_exchange.h"

namespace txl {

struct HttpServerConfig {
  std::string listen = "127.0.0.1:8080";  // HOST:PORT; port 0 picks a free one
  int threads = 2;                        // the transport's threads (never blocked)
  int64_t max_body_bytes = 4 << 20;       // a bigger body gets 413
  // Open connections. At the bound a new one closes the connection that has
  // waited longest with no request in flight (idle, or still sending its
  // request: WaitingConnections); with none, the new one is closed at once.
  int max_connections = 1024;
  // For a request's head, from its first byte (on a new connection: from the
  // accept, the TLS handshake included).
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Seconds(30);   // a kept-alive connection's wait for its next request
  absl::Duration read_timeout = absl::Seconds(30);   // for a request's body, once its head has arrived
  absl::Duration write_timeout = absl::Seconds(30);  // for one write to drain to a client
  std::vector<std::string> allow_origins;            // CORS: exact origins, or "*"; empty: no CORS
  // TLS (PEM text, not paths): a certificate chain and its key turn TLS on;
  // a client CA also requires and verifies client certificates.
  std::string tls_cert_pem, tls_key_pem, tls_client_ca_pem;
};

class HttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(const HttpServerConfig& config, HttpHandler handler);
  virtual ~HttpServer() = default;
  virtual int port() const = 0;
  // Requests read and not yet answered in full (the last byte written, or
  // the client gone): a drain waits for these.
  virtual int requests_in_flight() const = 0;
  // Closes the listening socket; open connections carry on.
  virtual void StopAccepting() = 0;
  // Closes every connection and joins the threads.
  virtual void Stop() = 0;
};

// The status line's text for a code ("Not Found"), for error bodies.
std::string HttpReason(int status);

}  // namespace txl

#endif  // TXL_SERVER_HTTP_HTTP_SERVER_H_
