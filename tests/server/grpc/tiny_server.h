// The real txl-server binary on a tiny model made here (ModelPath), and the
// client calls its integration tests make: connect, generate (streamed and
// collected), create a session.
#ifndef TXL_TESTS_SERVER_API_TINY_SERVER_H_
#define TXL_TESTS_SERVER_API_TINY_SERVER_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "client/txl_client.h"
#include "model/net/checkpoint.h"
#include "tests/server/grpc/server_process.h"

namespace txl::testing {

inline ModelConfig TinyConfig() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 32;
  c.d_head = 16;
  c.d_inner = 64;
  c.mem_len = 24;
  c.n_token = 256;
  return c;
}

inline std::string ModelPath() {
  static const std::string path = [] {
    const std::string p =
        (std::filesystem::temp_directory_path() / ("txl_server_it_" + std::to_string(getpid()) + ".pt")).string();
    const ModelConfig c = TinyConfig();
    // Large weights make the distributions peaked, so greedy choices are
    // far from ties and batching differences could not flip them.
    EXPECT_TRUE(WriteInitialCheckpoint(p, c, Tokenizer::Byte(), 3, 0.3).ok());
    // ctest runs each test in a process of its own: without this, every
    // one of them left a checkpoint behind (the temp_files test).
    // (The handler runs after `path` is destroyed: it reads a copy that never is.)
    static const std::string* const written = new std::string(p);
    std::atexit([] {
      std::error_code ignored;  // the throwing form would terminate a passed test
      std::filesystem::remove(*written, ignored);
    });
    return p;
  }();
  return path;
}

inline std::unique_ptr<ServerProcess> StartServer(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--model=" + ModelPath(), "--max_new_tokens=5000"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::string output;
  auto p = ServerProcess::Start(TXL_SERVER_BINARY, args, &output);
  EXPECT_NE(p, nullptr) << output;
  return p;
}

inline std::unique_ptr<TxlClient> Connect(const ServerProcess& p) {
  ClientOptions o;
  o.server = p.address();
  return *TxlClient::Create(o);
}

inline v1::GenerateRequest Gen(const std::string& session, const std::string& text, int max_new, uint64_t seed = 0,
                               float temperature = 0) {
  v1::GenerateRequest r;
  r.set_session_id(session);
  if (!text.empty()) r.mutable_input()->set_text(text);
  r.set_max_new_tokens(max_new);
  r.mutable_sampling()->set_temperature(temperature);
  r.mutable_sampling()->set_seed(seed);
  return r;
}

struct Generated {
  absl::Status status;
  std::vector<int> ids;
  std::string text;
  std::vector<int64_t> positions;
  v1::GenerateResponse last;
};

inline Generated Stream(TxlClient& c, const v1::GenerateRequest& r) {
  Generated g;
  g.status = c.Generate(r, [&](const v1::GenerateResponse& resp) {
    for (const auto& t : resp.tokens()) g.ids.push_back(t.id());
    g.text += resp.text();
    g.positions.push_back(resp.position());
    g.last = resp;
  });
  return g;
}

inline std::string NewSession(TxlClient& c, int64_t mem_len = 0) {
  v1::CreateSessionRequest r;
  r.set_mem_len(mem_len);
  auto s = c.CreateSession(r);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? s->session_id() : "";
}

}  // namespace txl::testing

#endif  // TXL_TESTS_SERVER_API_TINY_SERVER_H_
