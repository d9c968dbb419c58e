// Runs the real txl-server binary for integration tests: on free loopback
// ports, with its stdout read until it says where it listens.
#ifndef TXL_TESTS_SERVER_API_SERVER_PROCESS_H_
#define TXL_TESTS_SERVER_API_SERVER_PROCESS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <regex>
#include <string>
#include <vector>

namespace txl::testing {

class ServerProcess {
 public:
  // Starts `binary args... --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 --http_listen=`
  // and waits (up to 60 s) for its "listening" line. Null if it exited
  // first; `output` then holds what it printed.
  static std::unique_ptr<ServerProcess> Start(const std::string& binary, std::vector<std::string> args,
                                              std::string* output = nullptr) {
    args.insert(args.begin(), binary);
    bool has_listen = false;
    for (const auto& a : args) has_listen |= a.rfind("--listen", 0) == 0;
    if (!has_listen) args.push_back("--listen=127.0.0.1:0");
    args.push_back("--metrics_listen=127.0.0.1:0");
    args.push_back("--http_listen=");  // off: parallel tests would share the default port
    int out[2];
    if (pipe(out) != 0) return nullptr;
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(out[1], 1);
      dup2(out[1], 2);
      close(out[0]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    auto p = std::unique_ptr<ServerProcess>(new ServerProcess(pid, out[0]));
    const std::regex ready("listening on [0-9.]+:([0-9]+), metrics on [0-9.]+:([0-9]+)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::smatch m;
    while (std::chrono::steady_clock::now() < deadline) {
      if (std::regex_search(p->output_, m, ready)) {
        p->port = std::stoi(m[1]);
        p->metrics_port = std::stoi(m[2]);
        return p;
      }
      if (!p->ReadSome(1000)) break;  // exited
    }
    if (output) *output = p->output_;
    return nullptr;
  }

  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(fd_);
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  void Signal(int sig) { kill(pid_, sig); }
  // Waits for exit (reading its output meanwhile); the exit code, or -1.
  int Wait(int timeout_ms = 30000) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        while (ReadSome(0)) {
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      ReadSome(50);
    }
    return -1;
  }
  const std::string& output() const { return output_; }

  int port = 0, metrics_port = 0;

 private:
  ServerProcess(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  // Reads what is available within timeout_ms; false at end of output.
  bool ReadSome(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return true;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof(buf));
    if (n <= 0) return false;
    output_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_;
  int fd_;
  std::string output_;
};

// A plain HTTP GET on loopback; the response body, or "" on failure.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (write(fd, req.data(), req.size()) < 0) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

}  // namespace txl::testing

#endif  // TXL_TESTS_SERVER_API_SERVER_PROCESS_H_
