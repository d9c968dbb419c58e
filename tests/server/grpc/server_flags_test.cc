// txl-server end to end, started with particular flags: the precision of its
// weights and memories (--dtype, --kv_dtype), its limits (sessions, memory
// budget, idle expiry, queue), and its lifecycle (SIGTERM's drain, start-up
// failures).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "base/host_memory.h"
#include "client/txl_client.h"
#include "tests/server/grpc/server_process.h"
#include "tests/server/grpc/tiny_server.h"

namespace txl {
namespace {

using testing::Connect;
using testing::Gen;
using testing::Generated;
using testing::ModelPath;
using testing::NewSession;
using testing::ServerProcess;
using testing::StartServer;
using testing::Stream;

// --dtype and --kv_dtype reach the model, and GetModelInfo and the start-up
// line report what it runs in (numerics are the model tests' business).
TEST(ServerPrecisionTest, ReportsTheDtypesItWasStartedWith) {
  auto server = StartServer({"--dtype=bfloat16", "--kv_dtype=bfloat16"});
  ASSERT_NE(server, nullptr);
  auto c = Connect(*server);
  auto info = c->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->dtype(), "bfloat16");
  EXPECT_EQ(info->kv_dtype(), "bfloat16");
  EXPECT_NE(server->output().find("txl-server: device cpu, dtype bfloat16, kv_dtype bfloat16, kernels "),
            std::string::npos)
      << server->output();

  auto int8 = StartServer({"--dtype=int8"});
  ASSERT_NE(int8, nullptr);
  info = Connect(*int8)->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->dtype(), "int8");
  EXPECT_EQ(info->kv_dtype(), "float32");
}

// A bad name fails at start-up, before the model loads: exit 1 (as every
// start-up failure) with a line naming the flag and the allowed values.
// txl-server with `flag` beside a good model: it must exit 1 before
// listening, its output containing `expected`.
void ExpectRefusedAtStart(const std::string& flag, const std::string& expected) {
  const std::string command = std::string(TXL_SERVER_BINARY) + " --model=" + ModelPath() +
                              " --listen=127.0.0.1:0 --metrics_listen= --http_listen= " + flag + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 1) << flag << ": " << output;
  EXPECT_NE(output.find(expected), std::string::npos) << flag << ": " << output;
  EXPECT_EQ(output.find("listening"), std::string::npos) << flag << ": " << output;
}

TEST(ServerPrecisionTest, BadDtypeNamesTheFlagAndExitsNonZero) {
  ExpectRefusedAtStart("--dtype=fp8", "txl-server: dtype: unknown 'fp8' (use float32, bfloat16 or int8)");
  ExpectRefusedAtStart("--kv_dtype=int8", "txl-server: kv_dtype: unknown 'int8' (use float32 or bfloat16)");
}

TEST(ServerFlagsTest, ARepositoryLoadNiceOutsideItsRangeNamesTheFlag) {
  ExpectRefusedAtStart("--repository_load_nice=20", "--repository_load_nice must be in [0, 19], got 20");
  ExpectRefusedAtStart("--repository_load_nice=-1", "--repository_load_nice must be in [0, 19], got -1");
}

// --kv_dtype bfloat16 halves what a session holds, as the API reports it
// and as it exports; images cross between the two kv dtypes (converted), and
// the session continues on the other server.
TEST(ServerPrecisionTest, Bf16MemoriesHalveSessionsAndImagesCrossOver) {
  auto wide = StartServer();
  auto narrow = StartServer({"--kv_dtype=bfloat16"});
  ASSERT_NE(wide, nullptr);
  ASSERT_NE(narrow, nullptr);
  auto cw = Connect(*wide);
  auto cn = Connect(*narrow);
  const std::string a = NewSession(*cw), b = NewSession(*cn);
  ASSERT_TRUE(Stream(*cw, Gen(a, "half the bytes", 4)).status.ok());
  ASSERT_TRUE(Stream(*cn, Gen(b, "half the bytes", 4)).status.ok());
  auto sa = cw->GetSession(a), sb = cn->GetSession(b);
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(sa->position(), sb->position());
  EXPECT_GT(sb->memory_bytes(), 0);
  EXPECT_EQ(2 * sb->memory_bytes(), sa->memory_bytes());
  auto ia = cw->ExportSession(a), ib = cn->ExportSession(b);
  ASSERT_TRUE(ia.ok() && ib.ok());
  EXPECT_LT(ib->size(), ia->size() * 6 / 10);  // the rings halve; the header does not

  // bfloat16 image into the float32 server, and the other way.
  auto up = cw->ImportSession(v1::ImportSessionRequest(), *ib);
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(up->position(), sb->position());
  EXPECT_EQ(cw->GetSession(up->session_id())->memory_bytes(), sa->memory_bytes());
  auto down = cn->ImportSession(v1::ImportSessionRequest(), *ia);
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ(cn->GetSession(down->session_id())->memory_bytes(), sb->memory_bytes());
  for (auto [client, id] : {std::pair{cw.get(), up->session_id()}, std::pair{cn.get(), down->session_id()}}) {
    const Generated g = Stream(*client, Gen(id, " on", 5));
    ASSERT_TRUE(g.status.ok()) << g.status;
    EXPECT_FALSE(g.ids.empty());
  }
}

TEST(ServerLimitsTest, MaxSessionsIsResourceExhausted) {
  auto server = StartServer({"--max_sessions=2"});
  ASSERT_NE(server, nullptr);
  auto c = Connect(*server);
  NewSession(*c);
  NewSession(*c);
  auto third = c->CreateSession(v1::CreateSessionRequest());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Stream(*c, Gen("", "throwaway", 1)).status.code(), absl::StatusCode::kResourceExhausted);
}

TEST(ServerLimitsTest, MemoryBudgetAdmitsFullWindowsOnly) {
  // Model of ModelPath(): 2 layers x 2 heads x 16, float32; mem_len 24 takes 24 ring slots of K and V.
  const int64_t full = 2 * 2 * 24 * 2 * 16 * 4;
  auto server = StartServer({"--session_memory_budget=" + std::to_string(2 * full + full / 2)});
  ASSERT_NE(server, nullptr);
  auto c = Connect(*server);
  const std::string a = NewSession(*c);
  NewSession(*c);
  auto third = c->CreateSession(v1::CreateSessionRequest());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("session memory budget"), std::string::npos) << third.status();
  v1::ForkSessionRequest fork;
  fork.set_session_id(a);
  EXPECT_EQ(c->ForkSession(fork).status().code(), absl::StatusCode::kResourceExhausted);
  NewSession(*c, 12);  // a smaller window still fits
  const std::string text = testing::HttpGet(server->metrics_port, "/metrics");
  EXPECT_NE(text.find("txl_session_memory_budget_bytes " + std::to_string(2 * full + full / 2)), std::string::npos)
      << text;
  EXPECT_NE(text.find("txl_sessions_max 1000"), std::string::npos) << text;
  ASSERT_TRUE(c->DeleteSession(a).ok());
  EXPECT_TRUE(c->CreateSession(v1::CreateSessionRequest()).ok());
}

// Metric `name`'s value in a /metrics page (-1: absent).
double MetricValue(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::strtod(text.c_str() + at + name.size() + 2, nullptr);
}

// Regression: on a CPU the default budget was no limit, so 1,000 sessions of
// mem_len 4096 could take a base-shaped model's server past the host's
// memory. It now comes from what the host has available, less headroom and
// the other host budgets; 0 still opts out.
TEST(ServerLimitsTest, DefaultBudgetOnACpuComesFromTheHostsMemory) {
  auto host = ReadHostMemory();
  ASSERT_TRUE(host.ok()) << host.status();
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const double budget =
      MetricValue(testing::HttpGet(server->metrics_port, "/metrics"), "txl_session_memory_budget_bytes");
  EXPECT_GT(budget, 0);
  EXPECT_LT(budget, static_cast<double>(host->total_bytes) * 0.9);
  EXPECT_NE(server->output().find("session memory budget"), std::string::npos) << server->output();
  EXPECT_NE(server->output().find("--host_headroom"), std::string::npos) << server->output();

  auto unlimited = StartServer({"--session_memory_budget=0"});
  ASSERT_NE(unlimited, nullptr);
  EXPECT_EQ(MetricValue(testing::HttpGet(unlimited->metrics_port, "/metrics"), "txl_session_memory_budget_bytes"), 0);

  std::string output;
  auto none =
      ServerProcess::Start(TXL_SERVER_BINARY, {"--model=" + ModelPath(), "--host_headroom=1000000000000000"}, &output);
  EXPECT_EQ(none, nullptr);
  EXPECT_NE(output.find("no host memory left for sessions"), std::string::npos) << output;
  EXPECT_NE(output.find("Give --session_memory_budget"), std::string::npos) << output;
}

TEST(ServerLimitsTest, IdleSessionsExpire) {
  auto server = StartServer({"--session_ttl=1"});
  ASSERT_NE(server, nullptr);
  auto c = Connect(*server);
  const std::string id = NewSession(*c);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  absl::StatusCode code = absl::StatusCode::kOk;
  while (std::chrono::steady_clock::now() < deadline) {
    code = c->GetSession(id).status().code();
    if (code == absl::StatusCode::kNotFound) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // waiting for a timer, not a race
  }
  EXPECT_EQ(code, absl::StatusCode::kNotFound);
  const std::string text = testing::HttpGet(server->metrics_port, "/metrics");
  EXPECT_NE(text.find("txl_session_evictions_total{reason=\"idle_ttl\"} 1"), std::string::npos) << text;
}

TEST(ServerLimitsTest, FullQueueIsResourceExhausted) {
  auto server = StartServer({"--max_batch=1", "--max_queue=1"});
  ASSERT_NE(server, nullptr);
  auto c = Connect(*server);
  // One long request holds the only batch slot; one waits; a third is refused.
  absl::Notification running;
  std::atomic<bool> seen{false};
  std::thread first([&] {
    auto c1 = Connect(*server);
    (void)c1->Generate(Gen("", "one", 3000), [&](const v1::GenerateResponse&) {
      if (!seen.exchange(true)) running.Notify();
    });
  });
  running.WaitForNotification();
  std::thread second([&] {
    auto c2 = Connect(*server);
    (void)Stream(*c2, Gen("", "two", 1));
  });
  // Wait until the second request is in the queue (the gauge says so).
  for (int i = 0; i < 2000; ++i) {
    if (testing::HttpGet(server->metrics_port, "/metrics").find("txl_queue_depth 1") != std::string::npos) break;
    std::this_thread::yield();
  }
  auto third = Stream(*c, Gen("", "three", 1));
  EXPECT_EQ(third.status.code(), absl::StatusCode::kResourceExhausted) << third.status;
  server->Signal(SIGTERM);  // ends the long request through the drain
  first.join();
  second.join();
}

TEST(ServerLifecycleTest, SigtermDrainsAndExitsZero) {
  auto server = StartServer({"--drain_timeout=2"});
  ASSERT_NE(server, nullptr);
  auto c = Connect(*server);
  absl::Notification running;
  std::atomic<bool> seen{false};
  absl::Status stream_status;
  std::thread t([&] {
    auto c1 = Connect(*server);
    stream_status = c1->Generate(Gen("", "drain", 4000), [&](const v1::GenerateResponse&) {
      if (!seen.exchange(true)) running.Notify();
    });
  });
  running.WaitForNotification();
  server->Signal(SIGTERM);
  // Health flips to NOT_SERVING and new work is refused while draining.
  absl::StatusOr<std::string> health;
  for (int i = 0; i < 2000; ++i) {
    health = c->Health();
    if (!health.ok() || *health != "SERVING") break;
    std::this_thread::yield();
  }
  if (health.ok()) {
    EXPECT_EQ(*health, "NOT_SERVING");
    EXPECT_EQ(Stream(*c, Gen("", "late", 1)).status.code(), absl::StatusCode::kUnavailable);
    // Regression: CreateSession was accepted while draining, and the session
    // died with the process a moment later.
    EXPECT_EQ(c->CreateSession(v1::CreateSessionRequest()).status().code(), absl::StatusCode::kUnavailable);
  }
  t.join();
  // The long stream ended within the drain: completed, or cancelled with its tokens kept.
  EXPECT_TRUE(stream_status.ok() || stream_status.code() == absl::StatusCode::kCancelled ||
              stream_status.code() == absl::StatusCode::kUnavailable)
      << stream_status;
  EXPECT_EQ(server->Wait(), 0) << server->output();
}

// Regression (busy port): gRPC's default SO_REUSEPORT let a second server
// bind a port in use and silently share it; it must fail with a message.
TEST(ServerLifecycleTest, BadModelAndBusyPortFailClearly) {
  std::string output;
  auto none = ServerProcess::Start(TXL_SERVER_BINARY, {"--model=/nonexistent/model.pt"}, &output);
  EXPECT_EQ(none, nullptr);
  EXPECT_NE(output.find("/nonexistent/model.pt: no such file"), std::string::npos) << output;

  auto first = StartServer();
  ASSERT_NE(first, nullptr);
  output.clear();
  auto second =
      ServerProcess::Start(TXL_SERVER_BINARY, {"--model=" + ModelPath(), "--listen=" + first->address()}, &output);
  EXPECT_EQ(second, nullptr);
  EXPECT_NE(output.find("cannot listen on " + first->address()), std::string::npos) << output;
}

}  // namespace
}  // namespace txl
