// txl-server with --model_repository, end to end through the C++ client:
// requests reach the model and version they name, sessions keep theirs
// across a newer version's arrival, a retired version is freed when its last
// session ends, and a damaged version is refused while the others serve.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client/txl_client.h"
#include "model/net/checkpoint.h"
#include "tests/server/grpc/server_process.h"
#include "tests/server/grpc/tiny_server.h"

namespace txl {
namespace {

namespace fs = std::filesystem;
using testing::Connect;
using testing::Gen;
using testing::Generated;
using ::testing::HasSubstr;
using testing::ServerProcess;
using testing::Stream;
using testing::TinyConfig;

// Publishes `name` version `version`: written beside the repository's
// layout, then renamed into it, as `txl-train --publish` does.
void Publish(const fs::path& dir, const std::string& name, int version, uint64_t seed,
             const Tokenizer& tokenizer = Tokenizer::Byte(), int64_t mem_len = TinyConfig().mem_len,
             int64_t n_layer = TinyConfig().n_layer) {
  ModelConfig c = TinyConfig();
  c.n_token = tokenizer.vocab_size();
  c.mem_len = mem_len;
  c.n_layer = n_layer;
  const fs::path staging = dir / name / (".staging-" + std::to_string(version));
  fs::create_directories(staging);
  ASSERT_TRUE(WriteInitialCheckpoint((staging / "model.pt").string(), c, tokenizer, seed, 0.3).ok());
  fs::rename(staging, dir / name / std::to_string(version));
}

// The state ListModels gives `name`@`version` ("" when it is not listed).
std::string StateOf(TxlClient& c, const std::string& name, int64_t version, std::string* reason = nullptr) {
  auto list = c.ListModels();
  EXPECT_TRUE(list.ok()) << list.status();
  if (!list.ok()) return "";
  for (const auto& m : list->models()) {
    if (m.name() == name && m.version() == version) {
      if (reason != nullptr) *reason = m.reason();
      return m.state();
    }
  }
  return "";
}

class RepositoryServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("txl_repo_it_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    Publish(dir_, "alpha", 1, 3);
    auto chars = Tokenizer::CharFromCorpus("abcdefghijklmnopqrstuvwxyz .,\n");
    ASSERT_TRUE(chars.ok());
    Publish(dir_, "beta", 1, 5, *chars, /*mem_len=*/40);
    std::string output;
    server_ = ServerProcess::Start(TXL_SERVER_BINARY, {"--model_repository=" + dir_.string()}, &output);
    ASSERT_NE(server_, nullptr) << output;
    client_ = Connect(*server_);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    fs::remove_all(dir_);
  }
  std::string NewSession(const std::string& model) {
    v1::CreateSessionRequest r;
    r.set_model(model);
    auto s = client_->CreateSession(r);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->session_id() : "";
  }

  fs::path dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<TxlClient> client_;
};

TEST_F(RepositoryServerTest, RequestsReachTheModelTheyName) {
  auto alpha = client_->Info("alpha");
  ASSERT_TRUE(alpha.ok()) << alpha.status();
  EXPECT_EQ(alpha->name(), "alpha");
  EXPECT_EQ(alpha->version(), 1);
  EXPECT_EQ(alpha->tokenizer(), "byte");
  auto beta = client_->Info("beta@1");
  ASSERT_TRUE(beta.ok()) << beta.status();
  EXPECT_EQ(beta->tokenizer(), "char");
  // Each model's own window is its sessions' default (--default_mem_len 0).
  EXPECT_EQ(alpha->default_mem_len(), 24);
  EXPECT_EQ(beta->default_mem_len(), 40);
  EXPECT_NE(beta->fingerprint(), alpha->fingerprint());

  // Two models: a request must say which.
  auto unnamed = client_->Info();
  EXPECT_EQ(unnamed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unnamed.status().message(), HasSubstr("model: required"));
  auto missing = client_->Info("gamma");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("gamma"));
  auto bad = client_->Info("alpha@0");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);

  // Each model reads input with its own tokenizer and vocabulary: 'Z' is
  // a byte for alpha, and not in beta's characters.
  v1::GenerateRequest on_alpha = Gen("", "Zebra", 4);
  on_alpha.set_model("alpha");
  EXPECT_TRUE(Stream(*client_, on_alpha).status.ok());
  v1::GenerateRequest on_beta = Gen("", "Zebra", 4);
  on_beta.set_model("beta");
  Generated refused = Stream(*client_, on_beta);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
  EXPECT_THAT(refused.status.message(), HasSubstr("input.text"));
  on_beta.mutable_input()->set_text("zebra");
  EXPECT_TRUE(Stream(*client_, on_beta).status.ok());

  // A session is on the model it was made of; naming another is refused.
  const std::string s = NewSession("beta");
  auto info = client_->GetSession(s);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->model(), "beta@1");
  EXPECT_EQ(info->mem_len(), 40);
  EXPECT_EQ(client_->GetSession(NewSession("alpha"))->mem_len(), 24);
  v1::GenerateRequest wrong = Gen(s, "abc", 2);
  wrong.set_model("alpha");
  Generated mismatch = Stream(*client_, wrong);
  EXPECT_EQ(mismatch.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.status.message(), HasSubstr("the session is on beta@1"));
  auto after = client_->GetSession(s);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->position(), 0);  // the refusal left it unchanged
  // With no model named, a session's request runs on its own.
  EXPECT_TRUE(Stream(*client_, Gen(s, "abc", 2)).status.ok());
}

TEST_F(RepositoryServerTest, ANewVersionServesNewSessionsWhileOldOnesKeepTheirs) {
  const std::string old_session = NewSession("alpha");
  ASSERT_TRUE(Stream(*client_, Gen(old_session, "Hello there", 6)).status.ok());
  // What version 1 answers next: a fork (on version 1 too) asked before
  // version 2 exists.
  v1::ForkSessionRequest fork;
  fork.set_session_id(old_session);
  auto reference = client_->ForkSession(fork);
  ASSERT_TRUE(reference.ok()) << reference.status();
  Generated expected = Stream(*client_, Gen(reference->session_id(), ", friend", 12));
  ASSERT_TRUE(expected.status.ok());
  ASSERT_TRUE(client_->DeleteSession(reference->session_id()).ok());

  Publish(dir_, "alpha", 2, 11);
  auto loaded = client_->LoadModel("alpha");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(StateOf(*client_, "alpha", 2), "READY");
  EXPECT_EQ(StateOf(*client_, "alpha", 1), "RETIRING");  // the policy keeps the newest; a session holds 1
  EXPECT_EQ(client_->Info("alpha")->version(), 2);
  // A retiring version takes nothing new, even pinned.
  v1::GenerateRequest pinned = Gen("", "Hi", 2);
  pinned.set_model("alpha@1");
  EXPECT_EQ(Stream(*client_, pinned).status.code(), absl::StatusCode::kNotFound);

  // The old session goes on, exactly, on version 1.
  Generated continued = Stream(*client_, Gen(old_session, ", friend", 12));
  ASSERT_TRUE(continued.status.ok()) << continued.status;
  EXPECT_EQ(continued.ids, expected.ids);
  EXPECT_EQ(client_->GetSession(old_session)->model(), "alpha@1");
  // New sessions answer as version 2, whose weights differ.
  const std::string new_session = NewSession("alpha");
  EXPECT_EQ(client_->GetSession(new_session)->model(), "alpha@2");
  ASSERT_TRUE(Stream(*client_, Gen(new_session, "Hello there", 6)).status.ok());
  Generated on_two = Stream(*client_, Gen(new_session, ", friend", 12));
  ASSERT_TRUE(on_two.status.ok());
  EXPECT_NE(on_two.ids, expected.ids);

  // Version 1 is freed once its last session ends.
  ASSERT_TRUE(client_->DeleteSession(old_session).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (StateOf(*client_, "alpha", 1) != "UNLOADED" && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the last job lets go of its lease
  }
  EXPECT_EQ(StateOf(*client_, "alpha", 1), "UNLOADED");
}

TEST_F(RepositoryServerTest, MigrateSessionRebuildsASessionOnANewerVersionFromItsHistory) {
  const std::string s = NewSession("alpha");
  Generated first = Stream(*client_, Gen(s, "Hello there", 6));
  ASSERT_TRUE(first.status.ok());
  Publish(dir_, "alpha", 2, 11);
  ASSERT_TRUE(client_->LoadModel("alpha").ok());

  // Refusals leave the session on its version.
  EXPECT_EQ(client_->MigrateSession(s, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->MigrateSession(s, "gamma").status().code(), absl::StatusCode::kNotFound);
  auto across = client_->MigrateSession(s, "beta");
  EXPECT_EQ(across.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(across.status().message(), HasSubstr("versions of its own model (alpha@1)"));
  EXPECT_EQ(client_->GetSession(s)->model(), "alpha@1");

  auto moved = client_->MigrateSession(s, "alpha");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->model(), "alpha@2");
  EXPECT_EQ(moved->position(), 17);  // its history is kept
  // Its 17 tokens are within the receptive field (2 layers x 23), so it now
  // equals a fresh version-2 session fed them.
  Generated next = Stream(*client_, Gen(s, ", friend", 12));
  ASSERT_TRUE(next.status.ok()) << next.status;
  v1::GenerateRequest fresh = Gen("", "", 12);
  fresh.set_model("alpha@2");
  for (char ch : std::string("Hello there")) fresh.mutable_input()->mutable_tokens()->add_ids(static_cast<uint8_t>(ch));
  for (int id : first.ids) fresh.mutable_input()->mutable_tokens()->add_ids(id);
  for (char ch : std::string(", friend")) fresh.mutable_input()->mutable_tokens()->add_ids(static_cast<uint8_t>(ch));
  Generated expected = Stream(*client_, fresh);
  ASSERT_TRUE(expected.status.ok()) << expected.status;
  EXPECT_EQ(next.ids, expected.ids);
  // Version 1 held nothing more: it is freed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (StateOf(*client_, "alpha", 1) != "UNLOADED" && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(StateOf(*client_, "alpha", 1), "UNLOADED");
  // Already there: answered as it is.
  auto again = client_->MigrateSession(s, "alpha@2");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->position(), 17 + 8 + 12);
  // A version of the model with another vocabulary cannot read its history.
  auto chars = Tokenizer::CharFromCorpus("abcdefghijklmnopqrstuvwxyz .,\n");
  ASSERT_TRUE(chars.ok());
  Publish(dir_, "alpha", 3, 13, *chars);
  ASSERT_TRUE(client_->LoadModel("alpha").ok());
  auto other = client_->MigrateSession(s, "alpha@3");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("another vocabulary"));
  EXPECT_EQ(client_->GetSession(s)->model(), "alpha@2");
}

TEST_F(RepositoryServerTest, ADamagedVersionIsRefusedWithItsReasonAndTheOthersServe) {
  const fs::path damaged = dir_ / "alpha" / "2";
  fs::create_directories(damaged);
  {
    std::ofstream f(damaged / "model.pt", std::ios::binary);
    f << "PK\x03\x04 not a whole archive";
  }
  auto loaded = client_->LoadModel("alpha");
  ASSERT_TRUE(loaded.ok()) << loaded.status();  // version 1 is still ready
  std::string reason;
  EXPECT_EQ(StateOf(*client_, "alpha", 2, &reason), "FAILED");
  EXPECT_THAT(reason, HasSubstr("model.pt"));
  EXPECT_EQ(StateOf(*client_, "alpha", 1), "READY");
  v1::GenerateRequest r = Gen("", "Hello", 3);
  r.set_model("alpha");
  EXPECT_TRUE(Stream(*client_, r).status.ok());

  // Unload: no new sessions of the model, and the model is listed as such.
  auto unloaded = client_->UnloadModel("beta");
  ASSERT_TRUE(unloaded.ok()) << unloaded.status();
  v1::CreateSessionRequest create;
  create.set_model("beta");
  EXPECT_EQ(client_->CreateSession(create).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->UnloadModel("gamma").status().code(), absl::StatusCode::kNotFound);
  auto reloaded = client_->LoadModel("beta");
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_TRUE(client_->CreateSession(create).ok());
}

// DIR/NAME/limits.json lowers the server's flags for one model: its window,
// its requests, its sessions. The others keep the server's.
TEST_F(RepositoryServerTest, EachModelKeepsItsOwnLimits) {
  Publish(dir_, "gamma", 1, 7);
  {
    std::ofstream f(dir_ / "gamma" / "limits.json");
    f << R"({"default_mem_len": 16, "max_mem_len": 32, "max_new_tokens": 5, "max_input_tokens": 10,
             "max_sessions": 2})";
  }
  Publish(dir_, "delta", 1, 9);
  {
    std::ofstream f(dir_ / "delta" / "limits.json");
    f << R"({"max_mem_len": 100000})";  // above the server's --max_mem_len 4096
  }
  ASSERT_TRUE(client_->LoadModel("gamma").ok());
  auto refused_load = client_->LoadModel("delta");
  EXPECT_EQ(refused_load.status().code(), absl::StatusCode::kFailedPrecondition);  // no version of delta is ready
  EXPECT_THAT(refused_load.status().message(), HasSubstr("limits.json"));
  std::string reason;
  EXPECT_EQ(StateOf(*client_, "delta", 1, &reason), "FAILED");
  EXPECT_THAT(reason, HasSubstr("delta/limits.json: max_mem_len 100000 exceeds the server's --max_mem_len 4096"));

  auto gamma = client_->Info("gamma");
  ASSERT_TRUE(gamma.ok()) << gamma.status();
  EXPECT_EQ(gamma->default_mem_len(), 16);
  EXPECT_EQ(gamma->max_mem_len(), 32);
  EXPECT_EQ(gamma->max_new_tokens(), 5);
  EXPECT_EQ(gamma->max_input_tokens(), 10);
  EXPECT_EQ(gamma->max_sessions(), 2);
  auto alpha = client_->Info("alpha");
  ASSERT_TRUE(alpha.ok());
  EXPECT_EQ(alpha->max_mem_len(), 4096);  // the server's flags
  EXPECT_EQ(alpha->max_new_tokens(), 4096);
  EXPECT_EQ(alpha->max_sessions(), 1000);

  // Requests on gamma meet its limits; the same requests on alpha pass.
  auto create = [&](const std::string& model, int64_t mem_len) {
    v1::CreateSessionRequest r;
    r.set_model(model);
    r.set_mem_len(mem_len);
    return client_->CreateSession(r);
  };
  auto wide = create("gamma", 33);
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wide.status().message(), HasSubstr("mem_len: must be in [1, 32]"));
  EXPECT_TRUE(create("alpha", 33).ok());
  for (const std::string model : {"gamma", "alpha"}) {
    v1::GenerateRequest many = Gen("", "Hi", 6);
    many.set_model(model);
    Generated g = Stream(*client_, many);
    if (model == "gamma") {
      EXPECT_EQ(g.status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(g.status.message(), HasSubstr("max_new_tokens: must be in [1, 5]"));
    } else {
      EXPECT_TRUE(g.status.ok()) << g.status;
    }
    v1::GenerateRequest long_input = Gen("", "0123456789A", 1);
    long_input.set_model(model);
    EXPECT_EQ(Stream(*client_, long_input).status.ok(), model == "alpha") << model;
  }
  // max_new_tokens 0 means 16, or the model's limit when that is less.
  v1::GenerateRequest unsized = Gen("", "Hi", 0);
  unsized.set_model("gamma");
  Generated five = Stream(*client_, unsized);
  ASSERT_TRUE(five.status.ok()) << five.status;
  EXPECT_EQ(five.ids.size(), 5u);

  // Its own window by default, and at most two of its sessions, across versions.
  auto first = create("gamma", 0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->mem_len(), 16);
  auto wide_one = create("gamma", 32);
  ASSERT_TRUE(wide_one.ok());
  auto third = create("gamma", 0);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("session limit of model gamma reached"));
  {  // version 2 loads with a narrower window
    std::ofstream f(dir_ / "gamma" / "limits.json");
    f << R"({"default_mem_len": 16, "max_mem_len": 24, "max_new_tokens": 5, "max_input_tokens": 10,
             "max_sessions": 2})";
  }
  Publish(dir_, "gamma", 2, 11);
  ASSERT_TRUE(client_->LoadModel("gamma").ok());
  ASSERT_EQ(StateOf(*client_, "gamma", 2), "READY");
  EXPECT_EQ(client_->Info("gamma@2")->max_mem_len(), 24);
  // A session keeps its window when it moves: one wider than the version allows stays where it is.
  auto moved = client_->MigrateSession(wide_one->session_id(), "gamma");
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(moved.status().message(),
              HasSubstr("the session's mem_len 32 is more than gamma@2 allows (max_mem_len 24)"));
  EXPECT_EQ(client_->GetSession(wide_one->session_id())->model(), "gamma@1");
  EXPECT_EQ(create("gamma", 0).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(create("alpha", 0).ok());
  ASSERT_TRUE(client_->DeleteSession(first->session_id()).ok());
  auto on_v2 = create("gamma", 0);
  ASSERT_TRUE(on_v2.ok()) << on_v2.status();
  EXPECT_EQ(on_v2->model(), "gamma@2");
}

TEST_F(RepositoryServerTest, MetricsCountEachVersionApart) {
  v1::GenerateRequest r = Gen("", "Hello", 5);
  r.set_model("alpha");
  ASSERT_TRUE(Stream(*client_, r).status.ok());
  const std::string beta_session = NewSession("beta");
  // The gauges follow the once-a-second tick; the counters are at once.
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    text = testing::HttpGet(server_->metrics_port, "/metrics");
    if (text.find("txl_model_sessions{model=\"beta@1\"} 1") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_THAT(text, HasSubstr("txl_model_tokens_generated_total{model=\"alpha@1\"} 5"));
  EXPECT_THAT(text, HasSubstr("txl_model_sessions{model=\"beta@1\"} 1"));
  EXPECT_THAT(text, HasSubstr("txl_model_version_state{model=\"alpha\",state=\"READY\",version=\"1\"} 1"));
  EXPECT_THAT(text, HasSubstr("txl_model_version_state{model=\"alpha\",state=\"FAILED\",version=\"1\"} 0"));
  EXPECT_EQ(text.find("txl_model_tokens_generated_total{model=\"beta@1\"}"), std::string::npos);
  // A model named by a client but not served adds no label.
  r.set_model("no-such-model");
  EXPECT_FALSE(Stream(*client_, r).status.ok());
  EXPECT_EQ(testing::HttpGet(server_->metrics_port, "/metrics").find("no-such-model"), std::string::npos);
}

// Two architectures (2 and 3 layers) on the generic kernels, whose session
// pools share --session_memory_budget (PoolBudget): 16 two-layer windows.
// Two-layer sessions come and go, leaving their pool's top free; three-layer
// sessions then need more than the budget's room, and take it from there.
// None is refused, and a two-layer session that lived through it answers as
// its fork did before. Without the trim, the fourth three-layer session is
// refused (RESOURCE_EXHAUSTED).
TEST(RepositoryPoolsServerTest, ArchitecturesShareTheSessionBudgetAndGiveEachOtherFreeRows) {
  const fs::path dir = fs::temp_directory_path() / ("txl_repo_pools_" + std::to_string(getpid()));
  fs::remove_all(dir);
  Publish(dir, "alpha", 1, 3);
  Publish(dir, "deep", 1, 5, Tokenizer::Byte(), TinyConfig().mem_len, /*n_layer=*/3);
  const ModelConfig c = TinyConfig();
  const int64_t window = 2 * c.n_layer * c.mem_len * c.n_head * c.d_head * 4;  // alpha's, float32
  std::string output;
  auto server = ServerProcess::Start(TXL_SERVER_BINARY,
                                     {"--model_repository=" + dir.string(), "--kernels=generic",
                                      "--session_memory_budget=" + std::to_string(16 * window)},
                                     &output);
  ASSERT_NE(server, nullptr) << output;
  auto client = Connect(*server);
  const auto session = [&](const std::string& model) {
    v1::CreateSessionRequest r;
    r.set_model(model);
    auto s = client->CreateSession(r);
    EXPECT_TRUE(s.ok()) << model << ": " << s.status();
    return s.ok() ? s->session_id() : "";
  };
  const std::string fill(c.mem_len + 6, 'x');  // more than a window: every slot held

  const std::string lived = session("alpha");
  ASSERT_TRUE(Stream(*client, Gen(lived, "Hello there", 6)).status.ok());
  v1::ForkSessionRequest fork;
  fork.set_session_id(lived);
  auto reference = client->ForkSession(fork);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const Generated expected = Stream(*client, Gen(reference->session_id(), ", friend", 12));
  ASSERT_TRUE(expected.status.ok()) << expected.status;
  ASSERT_TRUE(client->DeleteSession(reference->session_id()).ok());

  std::vector<std::string> gone;
  for (int i = 0; i < 8; ++i) {
    gone.push_back(session("alpha"));
    const Generated g = Stream(*client, Gen(gone.back(), fill, 1));
    ASSERT_TRUE(g.status.ok()) << "alpha session " << i << ": " << g.status;
  }
  for (const std::string& id : gone) ASSERT_TRUE(client->DeleteSession(id).ok());
  std::vector<std::string> deep;
  for (int i = 0; i < 8; ++i) {
    deep.push_back(session("deep"));
    const Generated g = Stream(*client, Gen(deep.back(), fill, 1));
    ASSERT_TRUE(g.status.ok()) << "deep session " << i << ": " << g.status;
  }
  const Generated continued = Stream(*client, Gen(lived, ", friend", 12));
  ASSERT_TRUE(continued.status.ok()) << continued.status;
  EXPECT_EQ(continued.ids, expected.ids);
  client.reset();
  server.reset();
  fs::remove_all(dir);
}

// A --model file's session pool counts against --session_memory_budget as
// a repository's pools do (SharedSlotPools::Limit). With the budget's
// sessions filled, what admission does not count is refused
// RESOURCE_EXHAUSTED naming the budget: a Score that does not commit (a
// copy), and a rewind to an earlier position (a state rebuilt beside the
// session's own). The session answers afterwards as it did before. Before,
// the file's pool grew past the budget.
TEST(SingleModelServerTest, AFileServersPoolHoldsItsRowsWithinTheSessionBudget) {
  const ModelConfig c = TinyConfig();
  const int64_t window = 2 * c.n_layer * c.mem_len * c.n_head * c.d_head * 4;  // float32
  auto server = testing::StartServer({"--kernels=generic", "--session_memory_budget=" + std::to_string(3 * window)});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  const std::string fill(c.mem_len + 6, 'x');  // more than a window: every slot held
  const auto filled = [&] {
    auto s = client->CreateSession(v1::CreateSessionRequest());
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return std::string();
    const Generated g = Stream(*client, Gen(s->session_id(), fill, 1));
    EXPECT_TRUE(g.status.ok()) << g.status;
    return s->session_id();
  };
  const std::string a = filled();
  v1::ScoreRequest probe;
  probe.set_session_id(a);
  probe.mutable_input()->set_text(" a probe");
  probe.set_commit(false);
  auto before = client->Score(probe);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_FALSE(filled().empty());
  const std::string third = filled();
  ASSERT_FALSE(third.empty());
  auto refused = client->Score(probe);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("--session_memory_budget"));
  const int64_t position = client->GetSession(a)->position();
  auto rewound = client->RewindSession(a, position - 8);  // rebuilt from the start: no turn ends there
  EXPECT_EQ(rewound.status().code(), absl::StatusCode::kResourceExhausted) << rewound.status();
  EXPECT_THAT(rewound.status().message(), HasSubstr("--session_memory_budget"));
  EXPECT_EQ(client->GetSession(a)->position(), position);
  ASSERT_TRUE(client->DeleteSession(third).ok());
  auto after = client->Score(probe);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->DebugString(), before->DebugString());
}

TEST(SingleModelServerTest, LoadAndUnloadNeedARepository) {
  auto server = testing::StartServer();
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto list = client->ListModels();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->models_size(), 1);
  EXPECT_EQ(list->models(0).state(), "READY");
  EXPECT_EQ(client->Info(list->models(0).name())->version(), 1);
  auto load = client->LoadModel(list->models(0).name());
  EXPECT_EQ(load.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(load.status().message(), HasSubstr("--model_repository"));
}

}  // namespace
}  // namespace txl
