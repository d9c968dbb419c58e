#include "server/metrics/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace txl {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Create(const std::string& listen,
                                                                         std::function<std::string()> render) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics_listen: '", listen, "' is not HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics_listen: '", host, "' is not an IPv4 address"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 16) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", listen, ": ", why));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(fd, ntohs(addr.sin_port), std::move(render)));
}

MetricsEndpoint::MetricsEndpoint(int fd, int port, std::function<std::string()> render)
    : fd_(fd), port_(port), render_(std::move(render)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  stop_.store(true);
  thread_.join();
  close(fd_);
}

void MetricsEndpoint::Serve() {
  while (!stop_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;  // wakes to notice stop_
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    // Read the request head (bounded); every path serves the metrics.
    std::string request;
    char buf[1024];
    pollfd c{conn, POLLIN, 0};
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < 8192 && poll(&c, 1, 1000) > 0) {
      const ssize_t n = read(conn, buf, sizeof(buf));
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    const bool head = request.rfind("HEAD ", 0) == 0;
    const std::string body = render_();
    std::string response = absl::StrCat("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n",
                                        "Content-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
    if (!head) response += body;
    size_t sent = 0;
    while (sent < response.size()) {
      const ssize_t n = send(conn, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    close(conn);
  }
}

}  // namespace txl
