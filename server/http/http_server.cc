// The Beast transport behind HttpServer. Each connection lives on its own
// strand: every step of it (read, the route's answers, writes) runs there in
// order, so a connection needs no lock. The routes' calls arrive from other
// threads and are posted onto the strand.
//
// A connection's life: it waits for a request (a new connection: its head
// within header_timeout of the accept; a kept-alive one: idle up to
// idle_timeout, then the head within header_timeout of its first byte; the
// body within read_timeout), and while it waits it is on the server's
// WaitingConnections, where a new connection past max_connections may evict
// it. Its request is then in flight until the last byte of the answer is
// written (or the client is gone), and it is never evicted.
#include "server/http/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/waiting_connections.h"

namespace txl {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::chrono::steady_clock::duration ToChrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

class ServerImpl;
using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// One TCP connection: requests one after another (keep-alive), each answered
// through a ConnectionExchange before the next is read. Stream: PlainStream,
// or TlsStream (the handshake first).
template <class Stream>
class Connection : public std::enable_shared_from_this<Connection<Stream>> {
 public:
  Connection(Stream stream, ServerImpl* server);
  ~Connection();
  void Start();

  // The exchange's calls, on the strand.
  void Respond(int status, std::string content_type, std::string body);
  void StartStream(int status, std::string content_type);
  void Send(std::string chunk, std::function<void()> written);
  void EndStream();
  void OnClientGone(std::function<void()> closed);

 private:
  template <class S>
  friend class ConnectionExchange;
  using std::enable_shared_from_this<Connection<Stream>>::shared_from_this;
  tcp::socket& socket() { return beast::get_lowest_layer(stream_).socket(); }
  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }
  struct Write {
    enum Kind { kWhole, kHead, kChunk, kLast } kind;
    std::shared_ptr<http::response<http::string_body>> whole;
    std::string chunk;
    std::function<void()> written;
  };

  void AwaitNext();  // between requests on a kept-alive connection
  void ReadHead();
  void OnHead(beast::error_code ec);
  void OnRequest(beast::error_code ec);
  void Wait();  // on the server's WaitingConnections until Busy
  void Busy();
  void Evict(WaitingConnections::Key key);
  void BeginRequest();
  void EndRequest();
  void WatchForDisconnect();
  void Reply(http::response<http::string_body> res);  // a transport-level answer (413, 400, CORS preflight)
  void Push(Write w);
  void WriteNext();
  void OnWritten(beast::error_code ec);
  void Gone();
  void ResponseDone();
  void SetCommonHeaders(http::fields& f) const;

  Stream stream_;
  ServerImpl* server_;
  beast::flat_buffer buffer_;
  std::unique_ptr<http::request_parser<http::string_body>> parser_;
  bool keep_alive_ = false;
  std::string origin_;  // the request's Origin when CORS allows it, else empty
  // The answer in progress.
  bool answered_ = false;   // Respond or StartStream seen
  bool streaming_ = false;  // chunked
  bool complete_ = false;   // the last byte queued
  bool gone_ = false;
  uint64_t serial_ = 0;                  // of the request being read or answered
  WaitingConnections::Key waiting_ = 0;  // while waiting for a request; else 0
  bool in_flight_ = false;               // a request read and not yet answered in full
  std::function<void()> on_gone_;
  std::deque<Write> queue_;
  bool writing_ = false;
  std::shared_ptr<http::response<http::empty_body>> head_;
  std::unique_ptr<http::response_serializer<http::empty_body>> head_writer_;
};

// What the route holds: forwards onto the connection's strand.
template <class Stream>
class ConnectionExchange final : public HttpExchange {
 public:
  ConnectionExchange(std::shared_ptr<Connection<Stream>> c, HttpRequest request) : c_(std::move(c)) {
    request_ = std::move(request);
  }
  void Respond(int status, const std::string& content_type, std::string body) override {
    Post([c = c_, status, content_type, body = std::move(body)]() mutable {
      c->Respond(status, std::move(content_type), std::move(body));
    });
  }
  void StartStream(int status, const std::string& content_type) override {
    Post([c = c_, status, content_type] { c->StartStream(status, content_type); });
  }
  void Send(std::string chunk, std::function<void()> written) override {
    Post([c = c_, chunk = std::move(chunk), written = std::move(written)]() mutable {
      c->Send(std::move(chunk), std::move(written));
    });
  }
  void EndStream() override {
    Post([c = c_] { c->EndStream(); });
  }
  void OnClientGone(std::function<void()> closed) override {
    Post([c = c_, closed = std::move(closed)]() mutable { c->OnClientGone(std::move(closed)); });
  }
  void Run(std::function<void()> work) override { Post(std::move(work)); }

 private:
  void Post(std::function<void()> f) { asio::post(c_->stream_.get_executor(), std::move(f)); }
  std::shared_ptr<Connection<Stream>> c_;
};

class ServerImpl final : public HttpServer {
 public:
  ServerImpl(const HttpServerConfig& config, HttpHandler handler)
      : config_(config), handler_(std::move(handler)), acceptor_(io_), tls_(asio::ssl::context::tls_server) {}
  ~ServerImpl() override { Stop(); }

  absl::Status Open() {
    if (!config_.tls_cert_pem.empty()) {
      // The gRPC port's certificate, key and client CA (mutual TLS), as PEM.
      beast::error_code ec;
      tls_.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
      tls_.use_certificate_chain(asio::buffer(config_.tls_cert_pem), ec);
      if (!ec) tls_.use_private_key(asio::buffer(config_.tls_key_pem), asio::ssl::context::pem, ec);
      if (!ec && !config_.tls_client_ca_pem.empty()) {
        tls_.add_certificate_authority(asio::buffer(config_.tls_client_ca_pem), ec);
        tls_.set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
      }
      if (ec) return absl::InvalidArgumentError(absl::StrCat("TLS: ", ec.message()));
    }
    const size_t colon = config_.listen.rfind(':');
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(config_.listen.substr(colon + 1), &port) || port < 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("expected HOST:PORT, got \"", config_.listen, "\""));
    }
    std::string host = config_.listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    beast::error_code ec;
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(host, std::to_string(port), ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot resolve \"", host, "\": ", ec.message()));
    }
    const tcp::endpoint endpoint = results.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", config_.listen, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (int i = 0; i < std::max(1, config_.threads); ++i) threads_.emplace_back([this] { io_.run(); });
    return absl::OkStatus();
  }

  int port() const override { return port_; }
  int requests_in_flight() const override { return in_flight.load(); }
  void StopAccepting() override {
    asio::post(io_, [this] {
      beast::error_code ec;
      acceptor_.close(ec);
    });
  }
  void Stop() override {
    if (stopped_.exchange(true)) return;
    io_.stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  const HttpServerConfig& config() const { return config_; }
  asio::ssl::context& tls() { return tls_; }
  const HttpHandler& handler() const { return handler_; }
  // Before io_: connections its destructor destroys still use them.
  std::atomic<int> connections{0};
  std::atomic<int> in_flight{0};
  WaitingConnections waiting;

 private:
  void Accept() {
    acceptor_.async_accept(asio::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) {
        // At the bound, the connection that has waited longest for a request makes room; when
        // every one has a request in flight, the new one is closed (a reset, not a hang).
        if (connections.load() >= config_.max_connections && !waiting.EvictOldest()) {
          socket.close(ec);
        } else {
          // Events are small writes: with Nagle's algorithm each response's first one on a
          // kept-alive connection waits for the client's delayed ACK (40 ms on Linux).
          socket.set_option(tcp::no_delay(true), ec);
          if (config_.tls_cert_pem.empty()) {
            std::make_shared<Connection<PlainStream>>(PlainStream(std::move(socket)), this)->Start();
          } else {
            std::make_shared<Connection<TlsStream>>(TlsStream(std::move(socket), tls_), this)->Start();
          }
        }
      }
      Accept();
    });
  }

  HttpServerConfig config_;
  HttpHandler handler_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::ssl::context tls_;
  int port_ = 0;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopped_{false};
};

template <class Stream>
Connection<Stream>::Connection(Stream stream, ServerImpl* server) : stream_(std::move(stream)), server_(server) {
  server_->connections.fetch_add(1);
  // The disconnect watch peeks synchronously: it must never wait (Beast's
  // own operations are asynchronous whatever this says).
  beast::error_code ignored;
  socket().non_blocking(true, ignored);
}
template <class Stream>
Connection<Stream>::~Connection() {
  if (waiting_ != 0) server_->waiting.Remove(waiting_);
  EndRequest();
  server_->connections.fetch_sub(1);
}

template <class Stream>
void Connection<Stream>::Start() {
  // One deadline for the TLS handshake and the first request's head.
  lowest().expires_after(ToChrono(server_->config().header_timeout));
  Wait();
  if constexpr (std::is_same_v<Stream, TlsStream>) {
    stream_.async_handshake(asio::ssl::stream_base::server, [self = shared_from_this()](beast::error_code ec) {
      if (ec) return;  // not TLS, or refused (e.g. no client certificate): the connection just closes
      self->ReadHead();
    });
  } else {
    ReadHead();
  }
}

template <class Stream>
void Connection<Stream>::AwaitNext() {
  Wait();
  if (buffer_.size() > 0) {  // the next request had begun (pipelined)
    lowest().expires_after(ToChrono(server_->config().header_timeout));
    ReadHead();
    return;
  }
  lowest().expires_after(ToChrono(server_->config().idle_timeout));
  stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->buffer_.commit(n);
    if (ec) return self->OnRequest(ec);
    self->lowest().expires_after(ToChrono(self->server_->config().header_timeout));
    self->ReadHead();
  });
}

template <class Stream>
void Connection<Stream>::ReadHead() {
  ++serial_;
  answered_ = streaming_ = complete_ = gone_ = false;
  on_gone_ = nullptr;
  origin_.clear();
  parser_ = std::make_unique<http::request_parser<http::string_body>>();
  parser_->body_limit(static_cast<uint64_t>(server_->config().max_body_bytes));
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHead(ec); });
}

template <class Stream>
void Connection<Stream>::OnHead(beast::error_code ec) {
  if (ec || parser_->is_done()) return OnRequest(ec);
  lowest().expires_after(ToChrono(server_->config().read_timeout));
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRequest(ec); });
}

template <class Stream>
void Connection<Stream>::Wait() {
  std::weak_ptr<Connection> weak = shared_from_this();
  waiting_ = server_->waiting.Add([weak](WaitingConnections::Key key) {
    if (auto self = weak.lock()) asio::post(self->stream_.get_executor(), [self, key] { self->Evict(key); });
  });
}

template <class Stream>
void Connection<Stream>::Busy() {
  if (waiting_ == 0) return;
  server_->waiting.Remove(waiting_);
  waiting_ = 0;
}

// A newer connection needed the room: closed, unless it moved on (its
// request went in flight, or it waits again under a newer key) meanwhile.
template <class Stream>
void Connection<Stream>::Evict(WaitingConnections::Key key) {
  if (waiting_ != key) return;
  waiting_ = 0;
  beast::error_code ignored;
  socket().shutdown(tcp::socket::shutdown_both, ignored);
  lowest().close();  // the pending read ends with operation_aborted
}

template <class Stream>
void Connection<Stream>::BeginRequest() {
  Busy();
  in_flight_ = true;
  server_->in_flight.fetch_add(1);
}

template <class Stream>
void Connection<Stream>::EndRequest() {
  if (!in_flight_) return;
  in_flight_ = false;
  server_->in_flight.fetch_sub(1);
}

template <class Stream>
void Connection<Stream>::SetCommonHeaders(http::fields& f) const {
  f.set(http::field::server, "txl-server");
  if (!origin_.empty()) {
    f.set(http::field::access_control_allow_origin, origin_);
    f.set(http::field::vary, "Origin");
  }
}

template <class Stream>
void Connection<Stream>::Reply(http::response<http::string_body> res) {
  answered_ = true;
  complete_ = true;
  SetCommonHeaders(res.base());
  res.keep_alive(keep_alive_);
  res.prepare_payload();
  Write w{Write::kWhole, std::make_shared<http::response<http::string_body>>(std::move(res)), {}, nullptr};
  Push(std::move(w));
}

template <class Stream>
void Connection<Stream>::OnRequest(beast::error_code ec) {
  if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::connection_reset ||
      ec == asio::error::eof || ec == asio::error::operation_aborted) {
    Busy();
    beast::error_code ignored;
    socket().shutdown(tcp::socket::shutdown_send, ignored);
    return;
  }
  BeginRequest();
  if (ec) {
    // A request the parser refused: say why, then close (its framing is unknown).
    keep_alive_ = false;
    const bool too_big = ec == http::error::body_limit || ec == http::error::header_limit;
    http::response<http::string_body> res{too_big ? http::status::payload_too_large : http::status::bad_request, 11};
    res.set(http::field::content_type, "application/json");
    const std::string what = ec == http::error::body_limit
                                 ? absl::StrCat("request body exceeds ", server_->config().max_body_bytes, " bytes")
                                 : absl::StrCat("malformed HTTP request: ", ec.message());
    res.body() = absl::StrCat(R"({"error":{"message":")", what, R"(","type":"invalid_request_error","param":null,)",
                              R"("code":")", too_big ? "request_too_large" : "bad_request", "\"}}");
    Reply(std::move(res));
    return;
  }
  http::request<http::string_body> req = parser_->release();
  keep_alive_ = req.keep_alive();
  // CORS: only for origins the operator named.
  const std::string origin(req[http::field::origin]);
  if (!origin.empty()) {
    for (const std::string& allowed : server_->config().allow_origins) {
      if (allowed == "*" || allowed == origin) origin_ = allowed == "*" ? "*" : origin;
    }
  }
  if (req.method() == http::verb::options && !origin_.empty()) {  // a preflight
    http::response<http::string_body> res{http::status::no_content, 11};
    res.set(http::field::access_control_allow_methods, "GET, POST, DELETE, OPTIONS");
    res.set(http::field::access_control_allow_headers, "Authorization, Content-Type, txl-session-id");
    res.set(http::field::access_control_max_age, "600");
    Reply(std::move(res));
    return;
  }
  HttpRequest r;
  r.method = std::string(req.method_string());
  const std::string target(req.target());
  const size_t q = target.find('?');
  r.path = target.substr(0, q);
  if (q != std::string::npos) r.query = target.substr(q + 1);
  for (const auto& field : req)
    r.headers[absl::AsciiStrToLower(std::string(field.name_string()))] = std::string(field.value());
  r.body = std::move(req.body());
  lowest().expires_never();  // a route may take as long as its generation; writes set their own
  WatchForDisconnect();
  auto exchange = std::make_shared<ConnectionExchange<Stream>>(shared_from_this(), std::move(r));
  try {
    server_->handler()(exchange);
  } catch (const std::exception&) {  // a route's bug must not take the server down
    exchange->Respond(500, "application/json",
                      absl::StrCat(R"({"error":{"message":"internal error","type":"server_error","param":null,)",
                                   R"("code":"internal"}})"));
  }
}

// While an answer is pending the client sends nothing (or a pipelined next
// request, left in the socket): the socket turning readable with nothing to
// read means the client closed it.
template <class Stream>
void Connection<Stream>::WatchForDisconnect() {
  const uint64_t serial = serial_;
  socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), serial](beast::error_code ec) {
    // A watch that outlived its request (the next one may be reading) says nothing.
    if (self->complete_ || self->serial_ != serial || ec == asio::error::operation_aborted) return;
    char byte;
    beast::error_code peek;
    const size_t n = self->socket().receive(asio::buffer(&byte, 1), tcp::socket::message_peek, peek);
    if (peek == asio::error::would_block || peek == asio::error::try_again) {
      self->WatchForDisconnect();  // nothing to read after all
    } else if (ec || peek || n == 0) {
      self->Gone();
    }
  });
}

template <class Stream>
void Connection<Stream>::Respond(int status, std::string content_type, std::string body) {
  if (answered_ || gone_) return;
  http::response<http::string_body> res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, content_type);
  res.body() = std::move(body);
  Reply(std::move(res));
}

template <class Stream>
void Connection<Stream>::StartStream(int status, std::string content_type) {
  if (answered_ || gone_) return;
  answered_ = streaming_ = true;
  head_ = std::make_shared<http::response<http::empty_body>>(static_cast<http::status>(status), 11);
  head_->set(http::field::content_type, content_type);
  head_->set(http::field::cache_control, "no-cache");
  head_->set("X-Accel-Buffering", "no");  // a proxy in front should not hold events back
  SetCommonHeaders(head_->base());
  head_->keep_alive(keep_alive_);
  head_->chunked(true);
  Push({Write::kHead, nullptr, {}, nullptr});
}

template <class Stream>
void Connection<Stream>::Send(std::string chunk, std::function<void()> written) {
  if (!streaming_ || complete_ || gone_) return;
  Push({Write::kChunk, nullptr, std::move(chunk), std::move(written)});
}

template <class Stream>
void Connection<Stream>::EndStream() {
  if (!streaming_ || complete_ || gone_) return;
  complete_ = true;
  Push({Write::kLast, nullptr, {}, nullptr});
}

template <class Stream>
void Connection<Stream>::OnClientGone(std::function<void()> closed) {
  if (gone_ && !complete_) {
    closed();
    return;
  }
  on_gone_ = std::move(closed);
}

template <class Stream>
void Connection<Stream>::Push(Write w) {
  queue_.push_back(std::move(w));
  if (!writing_) WriteNext();
}

template <class Stream>
void Connection<Stream>::WriteNext() {
  if (queue_.empty() || gone_) return;
  writing_ = true;
  lowest().expires_after(ToChrono(server_->config().write_timeout));
  Write& w = queue_.front();
  auto done = [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWritten(ec); };
  switch (w.kind) {
    case Write::kWhole: http::async_write(stream_, *w.whole, std::move(done)); break;
    case Write::kHead:
      head_writer_ = std::make_unique<http::response_serializer<http::empty_body>>(*head_);
      http::async_write_header(stream_, *head_writer_, std::move(done));
      break;
    case Write::kChunk: asio::async_write(stream_, http::make_chunk(asio::buffer(w.chunk)), std::move(done)); break;
    case Write::kLast: asio::async_write(stream_, http::make_chunk_last(), std::move(done)); break;
  }
}

template <class Stream>
void Connection<Stream>::OnWritten(beast::error_code ec) {
  writing_ = false;
  lowest().expires_never();
  // A write that completed after the client was found gone (the disconnect
  // watch ran first and cleared the queue) has nothing left to report.
  if (ec || gone_ || queue_.empty()) {
    Gone();
    return;
  }
  Write w = std::move(queue_.front());
  queue_.pop_front();
  if (w.written) w.written();
  const bool last = w.kind == Write::kWhole || w.kind == Write::kLast;
  if (last) {
    ResponseDone();
    return;
  }
  WriteNext();
}

template <class Stream>
void Connection<Stream>::ResponseDone() {
  EndRequest();
  on_gone_ = nullptr;  // drops the route's callbacks (and what they hold)
  beast::error_code ignored;
  socket().cancel(ignored);  // the disconnect watch
  head_writer_.reset();
  head_.reset();
  if (!keep_alive_) {
    socket().shutdown(tcp::socket::shutdown_send, ignored);
    return;
  }
  // The watch's cancelled handler runs before the read starts (same strand).
  asio::post(stream_.get_executor(), [self = shared_from_this()] { self->AwaitNext(); });
}

template <class Stream>
void Connection<Stream>::Gone() {
  if (gone_) return;
  gone_ = true;
  EndRequest();
  queue_.clear();
  beast::error_code ignored;
  socket().close(ignored);
  if (!complete_ && on_gone_) {
    auto f = std::move(on_gone_);
    on_gone_ = nullptr;
    f();
  }
  on_gone_ = nullptr;
}

}  // namespace

std::string HttpReason(int status) { return std::string(http::obsolete_reason(static_cast<http::status>(status))); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(const HttpServerConfig& config, HttpHandler handler) {
  auto server = std::make_unique<ServerImpl>(config, std::move(handler));
  if (absl::Status s = server->Open(); !s.ok()) return s;
  return server;
}

}  // namespace txl
