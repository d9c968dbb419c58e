// HttpExchange: one HTTP request as a route sees it, and the ways to answer
// it. The transport (http_server.cc, the only file that includes Boost.Beast)
// implements it; routes (openai_gateway.cc) never see a socket. Every method
// is thread-safe and never blocks: an answer is queued and written by the
// transport's own threads.
#ifndef TXL_SERVER_HTTP_HTTP_EXCHANGE_H_
#define TXL_SERVER_HTTP_HTTP_EXCHANGE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace txl {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // the target without its query
  std::string query;                           // after '?', undecoded
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string Header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  const HttpRequest& request() const { return request_; }

  // A whole response (Content-Length). Exactly one of Respond or
  // StartStream per exchange; later calls are ignored.
  virtual void Respond(int status, const std::string& content_type, std::string body) = 0;
  // A chunked response whose chunks follow with Send.
  virtual void StartStream(int status, const std::string& content_type) = 0;
  // Queues one chunk; `written` runs (on a transport thread) once it is on
  // the wire: a route reads more from its source only then, so a slow client
  // holds back its own source and nothing else.
  virtual void Send(std::string chunk, std::function<void()> written) = 0;
  virtual void EndStream() = 0;
  // `closed` runs once if the client goes away before the response is
  // complete (a disconnect is a cancel); never after the response ended.
  virtual void OnClientGone(std::function<void()> closed) = 0;
  // Runs `work` on the transport's thread for this exchange, in order with
  // every call above: a route formats its answers there, not on the thread
  // that produced them (the engine's).
  virtual void Run(std::function<void()> work) = 0;

 protected:
  HttpRequest request_;
};

// Routes one exchange; it must not block (see HttpExchange).
using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

}  // namespace txl

#endif  // TXL_SERVER_HTTP_HTTP_EXCHANGE_H_
