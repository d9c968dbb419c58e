// txl-server end to end: the real binary on loopback, driven through the C++
// client library, with a tiny model made here: one server for the API's calls
// (ServerTest), cancelled calls in the metrics, and sessions moving between
// servers. Servers started with particular flags: server_flags_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "client/txl_client.h"
#include "tests/server/grpc/reflection_client.h"
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
using testing::TinyConfig;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = StartServer().release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    client_ = Connect(*server_);
  }
  static ServerProcess* server_;
  std::unique_ptr<TxlClient> client_;
};
ServerProcess* ServerTest::server_ = nullptr;

TEST_F(ServerTest, InfoAndHealth) {
  auto info = client_->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->n_token(), 256);
  EXPECT_EQ(info->n_layer(), 2);
  EXPECT_EQ(info->tokenizer(), "byte");
  EXPECT_EQ(info->default_mem_len(), 24);
  EXPECT_EQ(info->device(), "cpu");
  // float32 unless --dtype/--kv_dtype say otherwise.
  EXPECT_EQ(info->dtype(), "float32");
  EXPECT_EQ(info->kv_dtype(), "float32");
  EXPECT_EQ(*client_->Health(), "SERVING");
}

TEST_F(ServerTest, SessionLifecycle) {
  v1::CreateSessionRequest req;
  req.set_mem_len(32);
  (*req.mutable_labels())["app"] = "test";
  auto s = client_->CreateSession(req);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->session_id().size(), 32u);
  EXPECT_EQ(s->mem_len(), 32);
  EXPECT_EQ(s->position(), 0);
  auto got = client_->GetSession(s->session_id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->labels().at("app"), "test");
  bool listed = false;
  auto all = client_->ListSessions();
  ASSERT_TRUE(all.ok());
  for (const auto& x : all->sessions()) listed |= x.session_id() == s->session_id();
  EXPECT_TRUE(listed);
  EXPECT_TRUE(client_->DeleteSession(s->session_id()).ok());
  EXPECT_EQ(client_->GetSession(s->session_id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->DeleteSession(s->session_id()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Stream(*client_, Gen("no-such-session", "x", 1)).status.code(), absl::StatusCode::kNotFound);
}

TEST_F(ServerTest, ClientChosenSessionIds) {
  // The client library picks the id and sends it as metadata too.
  auto picked = client_->CreateSession(v1::CreateSessionRequest());
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ(picked->session_id().size(), 32u);
  v1::CreateSessionRequest req;
  req.set_session_id("00000000000000000000000000c0ffee");
  auto chosen = client_->CreateSession(req);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->session_id(), req.session_id());
  EXPECT_EQ(client_->CreateSession(req).status().code(), absl::StatusCode::kAlreadyExists);
  req.set_session_id("Not-A-Valid-Id");
  auto bad = client_->CreateSession(req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("session_id"), std::string::npos);
  EXPECT_TRUE(client_->DeleteSession("00000000000000000000000000c0ffee").ok());
}

TEST_F(ServerTest, InvalidArgumentsNameTheField) {
  auto expect = [&](absl::Status s, const std::string& field) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  };
  v1::CreateSessionRequest bad;
  bad.set_mem_len(-1);
  expect(client_->CreateSession(bad).status(), "mem_len");
  bad.set_mem_len(1 << 20);
  expect(client_->CreateSession(bad).status(), "mem_len");
  expect(Stream(*client_, Gen("", "a", 100000)).status, "max_new_tokens");
  expect(Stream(*client_, Gen("", "a", 2, 0, -1.0f)).status, "sampling.temperature");
  v1::GenerateRequest ids = Gen("", "", 2);
  ids.mutable_input()->mutable_tokens()->add_ids(999);
  expect(Stream(*client_, ids).status, "input.tokens.ids[0]");
  expect(Stream(*client_, Gen(NewSession(*client_), "", 2)).status, "input");
}

TEST_F(ServerTest, GenerateStreamsAndContinuesFromHistory) {
  const std::string id = NewSession(*client_);
  Generated a = Stream(*client_, Gen(id, "abc", 5));
  ASSERT_TRUE(a.status.ok()) << a.status;
  EXPECT_EQ(a.ids.size(), 5u);
  EXPECT_EQ(a.last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(a.last.usage().input_tokens(), 3);
  EXPECT_EQ(a.last.usage().generated_tokens(), 5);
  EXPECT_EQ(a.last.position(), 8);
  EXPECT_EQ(client_->GetSession(id)->position(), 8);
  Generated b = Stream(*client_, Gen(id, "", 3));
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_EQ(client_->GetSession(id)->position(), 11);

  // The same history fed at once continues the same way (greedy).
  std::string history = "abc";
  for (int t : a.ids) history += static_cast<char>(t);
  v1::GenerateRequest all;
  all.set_max_new_tokens(3);
  for (unsigned char ch : history) all.mutable_input()->mutable_tokens()->add_ids(ch);
  Generated c = Stream(*client_, all);
  EXPECT_EQ(c.ids, b.ids);
}

TEST_F(ServerTest, SeededSamplingIsReproducible) {
  const int sessions_before = client_->ListSessions()->sessions_size();
  Generated a = Stream(*client_, Gen("", "seed", 20, 1234, 1.0f));
  Generated b = Stream(*client_, Gen("", "seed", 20, 1234, 1.0f));
  Generated c = Stream(*client_, Gen("", "seed", 20, 4321, 1.0f));
  ASSERT_TRUE(a.status.ok()) << a.status;
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_NE(a.ids, c.ids);
  // Throw-away sessions (empty id) are gone when their request ends.
  EXPECT_EQ(client_->ListSessions()->sessions_size(), sessions_before);
}

std::vector<double> ScoreIn(TxlClient& c, const std::string& id, const std::string& text,
                            const std::vector<size_t>& cuts) {
  std::vector<double> out;
  size_t start = 0;
  for (size_t cut : cuts) {
    v1::ScoreRequest r;
    r.set_session_id(id);
    r.mutable_input()->set_text(text.substr(start, cut - start));
    r.set_commit(true);
    auto s = c.Score(r);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return out;
    for (const auto& t : s->tokens()) out.push_back(t.has_logprob() ? t.logprob() : 1.0);
    start = cut;
  }
  return out;
}

TEST_F(ServerTest, ScoreAgreesWholeInPiecesAndTokenByToken) {
  const std::string text = "the quick brown fox jumps over the lazy dog, twice: the quick brown fox";
  std::vector<size_t> whole = {text.size()}, pieces = {10, 33, text.size()}, single;
  for (size_t i = 1; i <= text.size(); ++i) single.push_back(i);
  auto a = ScoreIn(*client_, NewSession(*client_), text, whole);
  auto b = ScoreIn(*client_, NewSession(*client_), text, pieces);
  auto c = ScoreIn(*client_, NewSession(*client_), text, single);
  ASSERT_EQ(a.size(), text.size());
  ASSERT_EQ(b.size(), a.size());
  ASSERT_EQ(c.size(), a.size());
  EXPECT_EQ(a[0], 1.0);  // the first token has no prediction
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max({worst, std::abs(a[i] - b[i]), std::abs(a[i] - c[i])});
  std::cout << "Score whole / pieces / token-by-token max|diff| = " << worst << "\n";
  EXPECT_LT(worst, 1e-5);
}

TEST_F(ServerTest, ScoreWithoutCommitLeavesTheSession) {
  const std::string id = NewSession(*client_);
  ASSERT_TRUE(Stream(*client_, Gen(id, "hello", 2)).status.ok());
  v1::ScoreRequest r;
  r.set_session_id(id);
  r.mutable_input()->set_text("world");
  r.set_commit(false);
  auto first = client_->Score(r);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->position(), 7);
  EXPECT_TRUE(first->tokens(0).has_logprob());  // conditioned on the history
  auto again = client_->Score(r);
  EXPECT_EQ(again->total_logprob(), first->total_logprob());
  EXPECT_EQ(client_->GetSession(id)->position(), 7);
}

// GenerateRequest.echo through gRPC: the input's tokens with the log-probs
// Score gives, in the first token's response, or (max_new_tokens -1, nothing
// generated) in the last; never in `text`.
TEST_F(ServerTest, EchoReturnsTheInputsLogProbsAsScoreDoes) {
  const std::string text = "the quick brown fox";
  v1::ScoreRequest score;
  score.set_session_id(NewSession(*client_));
  score.mutable_input()->set_text(text);
  auto scored = client_->Score(score);
  ASSERT_TRUE(scored.ok()) << scored.status();
  for (const int max_new : {3, -1}) {
    v1::GenerateRequest r = Gen("", text, 0);
    r.set_max_new_tokens(max_new);
    r.set_echo(true);
    std::vector<v1::GenerateResponse> responses;
    std::string generated;
    const absl::Status s = client_->Generate(r, [&](const v1::GenerateResponse& resp) {
      responses.push_back(resp);
      generated += resp.text();
    });
    ASSERT_TRUE(s.ok()) << s;
    const v1::GenerateResponse& with_echo = max_new > 0 ? responses.front() : responses.back();
    EXPECT_EQ(max_new > 0 ? with_echo.tokens_size() : 0, max_new > 0 ? 1 : 0);
    ASSERT_EQ(with_echo.echo_size(), scored->tokens_size()) << max_new;
    for (int i = 0; i < with_echo.echo_size(); ++i) {
      EXPECT_EQ(with_echo.echo(i).id(), scored->tokens(i).id());
      EXPECT_EQ(with_echo.echo(i).text(), scored->tokens(i).text());
      EXPECT_EQ(with_echo.echo(i).has_logprob(), scored->tokens(i).has_logprob());
      EXPECT_NEAR(with_echo.echo(i).logprob(), scored->tokens(i).logprob(), 1e-5) << i;
    }
    int echoes = 0;
    for (const auto& resp : responses) echoes += resp.echo_size() > 0 ? 1 : 0;
    EXPECT_EQ(echoes, 1);
    int tokens = 0;
    for (const auto& resp : responses) tokens += resp.tokens_size();
    EXPECT_EQ(tokens, max_new > 0 ? 3 : 0);
    EXPECT_NE(generated.rfind(text, 0), 0u) << generated;  // the input is not in the text
    EXPECT_EQ(responses.back().usage().generated_tokens(), max_new > 0 ? 3 : 0);
  }
  // A byte-level model splits 'é' in two tokens: its text goes with the
  // second, and the texts join into the input.
  v1::GenerateRequest accented = Gen("", "caf\xc3\xa9", 0);
  accented.set_max_new_tokens(-1);
  accented.set_echo(true);
  const testing::Generated a = Stream(*client_, accented);
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_EQ(a.last.echo_size(), 5);
  std::string joined;
  for (const auto& t : a.last.echo()) joined += t.text();
  EXPECT_EQ(joined, "caf\xc3\xa9");
  EXPECT_EQ(a.last.echo(3).text(), "");
  EXPECT_EQ(a.last.echo(4).text(), "\xc3\xa9");

  v1::GenerateRequest none = Gen("", text, 0);
  none.set_max_new_tokens(-1);
  const absl::Status refused = Stream(*client_, none).status;
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("only for echo"), absl::string_view::npos) << refused;
}

TEST_F(ServerTest, ConcurrentSessionsGetWhatEachGetsAlone) {
  // Half greedy, half seeded sampling: batching must change neither.
  const int kSessions = 8;
  auto request = [](int i) {
    const std::string prompt(1 + i * 3, static_cast<char>('a' + i));
    return i % 2 == 0 ? Gen("", prompt, 12) : Gen("", prompt, 12, 100 + i, 0.9f);
  };
  std::vector<std::vector<int>> alone;
  for (int i = 0; i < kSessions; ++i) alone.push_back(Stream(*client_, request(i)).ids);
  std::vector<std::vector<int>> together(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      auto c = Connect(*server_);
      together[i] = Stream(*c, request(i)).ids;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_EQ(together[i].size(), 12u);
    EXPECT_EQ(together[i], alone[i]) << "session " << i;
  }
}

// The tokens a generation streams, whole (empty when it fails).
std::vector<v1::GeneratedToken> TokensOf(TxlClient& c, const v1::GenerateRequest& r) {
  std::vector<v1::GeneratedToken> tokens;
  const absl::Status s = c.Generate(r, [&](const v1::GenerateResponse& resp) {
    for (const auto& t : resp.tokens()) tokens.push_back(t);
  });
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? tokens : std::vector<v1::GeneratedToken>();
}

TEST_F(ServerTest, LogprobsCarryTheTopAlternatives) {
  v1::GenerateRequest r = Gen("", "alternatives", 4);
  r.set_logprobs(3);
  const std::vector<v1::GeneratedToken> tokens = TokensOf(*client_, r);
  ASSERT_EQ(tokens.size(), 4u);
  for (const auto& t : tokens) {
    ASSERT_EQ(t.top_size(), 3);
    EXPECT_GE(t.top(0).logprob(), t.top(1).logprob());
    EXPECT_GE(t.top(1).logprob(), t.top(2).logprob());
    EXPECT_EQ(t.top(0).id(), t.id());  // greedy: the chosen token is the most likely
    EXPECT_FLOAT_EQ(t.top(0).logprob(), t.logprob());
  }
  r.set_logprobs(1000);
  EXPECT_EQ(Stream(*client_, r).status.code(), absl::StatusCode::kInvalidArgument);
}

// logit_bias and the penalties (OpenAI's), through the real server: a banned
// token never comes, a forced one always does, seeds still reproduce, and a
// session's request leaves it as any generation does.
TEST_F(ServerTest, LogitBiasAndPenaltiesShapeTheDraw) {
  Generated plain = Stream(*client_, Gen("", "bias", 64, 77, 1.0f));
  ASSERT_TRUE(plain.status.ok()) << plain.status;
  // The token the model draws most here: banned, it never comes.
  std::map<int, int> counts;
  for (int id : plain.ids) ++counts[id];
  const int common =
      std::max_element(counts.begin(), counts.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  v1::GenerateRequest ban = Gen("", "bias", 64, 77, 1.0f);
  (*ban.mutable_sampling()->mutable_logit_bias())[common] = -100;
  Generated banned = Stream(*client_, ban);
  ASSERT_TRUE(banned.status.ok()) << banned.status;
  EXPECT_EQ(std::count(banned.ids.begin(), banned.ids.end(), common), 0);
  EXPECT_EQ(banned.ids.size(), 64u);
  EXPECT_EQ(Stream(*client_, ban).ids, banned.ids);  // seeded: the same again

  // Forced (+100), at temperature 1 and greedy, with its log-prob in the biased distribution.
  for (float temperature : {1.0f, 0.0f}) {
    v1::GenerateRequest force = Gen("", "bias", 16, 5, temperature);
    (*force.mutable_sampling()->mutable_logit_bias())[42] = 100;
    force.set_logprobs(2);
    const std::vector<v1::GeneratedToken> tokens = TokensOf(*client_, force);
    ASSERT_EQ(tokens.size(), 16u);
    for (const auto& t : tokens) {
      EXPECT_EQ(t.id(), 42);
      EXPECT_NEAR(t.logprob(), 0.0, 1e-3);
      EXPECT_EQ(t.top(0).id(), 42);
    }
  }

  // A frequency penalty turns greedy decoding away from what it repeats.
  Generated greedy = Stream(*client_, Gen("", "bias", 48, 0, 0.0f));
  v1::GenerateRequest penalised = Gen("", "bias", 48, 0, 0.0f);
  penalised.mutable_sampling()->set_frequency_penalty(2.0f);
  Generated fresh = Stream(*client_, penalised);
  ASSERT_TRUE(fresh.status.ok()) << fresh.status;
  std::map<int, int> greedy_counts, fresh_counts;
  for (int id : greedy.ids) ++greedy_counts[id];
  for (int id : fresh.ids) ++fresh_counts[id];
  EXPECT_NE(fresh.ids, greedy.ids);
  EXPECT_GT(fresh_counts.size(), greedy_counts.size());  // more distinct tokens

  // Refusals name the field, and leave a session where it was.
  const std::string id = NewSession(*client_);
  v1::GenerateRequest outside = Gen(id, "bias", 4);
  (*outside.mutable_sampling()->mutable_logit_bias())[256] = 1;
  Generated refused = Stream(*client_, outside);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status.message().find("sampling.logit_bias: token 256 is outside the vocabulary of 256"),
            std::string::npos)
      << refused.status;
  v1::GenerateRequest all = Gen(id, "bias", 4);
  for (int t = 0; t < 256; ++t) (*all.mutable_sampling()->mutable_logit_bias())[t] = -100;
  EXPECT_EQ(Stream(*client_, all).status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->GetSession(id)->position(), 0);
}

TEST_F(ServerTest, BusySessionIsAbortedAndUnchanged) {
  const std::string id = NewSession(*client_);
  absl::Notification first_token;
  std::atomic<bool> seen{false};
  Generated long_run;
  std::thread t([&] {
    auto c = Connect(*server_);
    long_run.status = c->Generate(Gen(id, "busy", 4000), [&](const v1::GenerateResponse& r) {
      long_run.ids.push_back(r.tokens_size());
      if (!seen.exchange(true)) first_token.Notify();
    });
  });
  first_token.WaitForNotification();
  EXPECT_EQ(Stream(*client_, Gen(id, "more", 2)).status.code(), absl::StatusCode::kAborted);
  v1::ScoreRequest score;
  score.set_session_id(id);
  score.mutable_input()->set_text("x");
  EXPECT_EQ(client_->Score(score).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(client_->DeleteSession(id).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(client_->GetSession(id)->busy());
  t.join();
  ASSERT_TRUE(long_run.status.ok()) << long_run.status;
  EXPECT_EQ(client_->GetSession(id)->position(), 4 + 4000);
}

TEST_F(ServerTest, CancelMidStreamKeepsEveryDeliveredToken) {
  const std::string id = NewSession(*client_);
  grpc::ClientContext ctx;
  ctx.AddMetadata("txl-session-id", id);
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::TransformerXL::NewStub(channel);
  v1::GenerateRequest req = Gen(id, "cancel me", 5000);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse r;
  int received = 0;
  while (received < 5 && reader->Read(&r)) received += r.tokens_size();
  ctx.TryCancel();
  while (reader->Read(&r)) received += r.tokens_size();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The session settles (not busy) with the input and at least every
  // delivered token in its history.
  absl::StatusOr<v1::Session> s;
  for (int i = 0; i < 500; ++i) {
    s = client_->GetSession(id);
    if (s.ok() && !s->busy()) break;
    std::this_thread::yield();
  }
  ASSERT_TRUE(s.ok());
  EXPECT_GE(s->position(), 9 + received);
  EXPECT_LT(s->position(), 9 + 5000);
  EXPECT_TRUE(Stream(*client_, Gen(id, "", 2)).status.ok());  // usable afterwards
}

TEST_F(ServerTest, ForkCopiesAndDiverges) {
  const std::string id = NewSession(*client_);
  ASSERT_TRUE(Stream(*client_, Gen(id, "shared prefix", 4)).status.ok());
  v1::ForkSessionRequest f;
  f.set_session_id(id);
  auto child = client_->ForkSession(f);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->position(), 17);
  // Regression: a fork got an unrelated id, which a proxy routing on the id's
  // prefix sent to another replica. It keeps its source's routing prefix.
  EXPECT_EQ(child->session_id().substr(0, 8), id.substr(0, 8));
  EXPECT_NE(child->session_id(), id);
  EXPECT_EQ(child->session_id().size(), 32u);
  Generated a = Stream(*client_, Gen(id, "", 6));
  Generated b = Stream(*client_, Gen(child->session_id(), "", 6));
  EXPECT_EQ(a.ids, b.ids);  // same history, greedy: same continuation
  ASSERT_TRUE(Stream(*client_, Gen(child->session_id(), "different", 3)).status.ok());
  EXPECT_EQ(client_->GetSession(id)->position(), 23);
  EXPECT_EQ(client_->GetSession(child->session_id())->position(), 35);
}

TEST_F(ServerTest, ConverseRunsTurnsOnOneStream) {
  const std::string id = NewSession(*client_);
  auto conv = client_->Converse(id);
  v1::GenerateResponse last;
  ASSERT_TRUE(conv->Turn(Gen(id, "hi", 3), [&](const v1::GenerateResponse& r) { last = r; }).ok());
  EXPECT_EQ(last.position(), 5);
  ASSERT_TRUE(conv->Turn(Gen(id, "again", 2), [&](const v1::GenerateResponse& r) { last = r; }).ok());
  EXPECT_EQ(last.position(), 12);
  EXPECT_TRUE(conv->Close().ok());
  EXPECT_EQ(client_->GetSession(id)->position(), 12);
}

TEST_F(ServerTest, SessionIdInMetadataOnly) {
  const std::string id = NewSession(*client_);
  auto stub = v1::TransformerXL::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("txl-session-id", id);
  v1::GetSessionRequest req;  // no id in the message
  v1::Session out;
  ASSERT_TRUE(stub->GetSession(&ctx, req, &out).ok());
  EXPECT_EQ(out.session_id(), id);
  grpc::ClientContext ctx2;
  ctx2.AddMetadata("txl-session-id", id);
  req.set_session_id("someone-else");
  EXPECT_EQ(stub->GetSession(&ctx2, req, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServerTest, ReflectionListsTheService) {
  const std::vector<std::string> names =
      testing::ListedServices(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  ASSERT_FALSE(names.empty());
  EXPECT_NE(std::find(names.begin(), names.end(), "txl.v1.TransformerXL"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "grpc.health.v1.Health"), names.end());
}

TEST_F(ServerTest, MetricsMoveAndNameNoSession) {
  const std::string id = NewSession(*client_);
  ASSERT_TRUE(Stream(*client_, Gen(id, "metrics", 5)).status.ok());
  const std::string text = testing::HttpGet(server_->metrics_port, "/metrics");
  ASSERT_FALSE(text.empty());
  for (const char* name :
       {"txl_requests_total", "txl_tokens_generated_total", "txl_tokens_fed_total", "txl_time_to_first_token_seconds",
        "txl_inter_token_seconds", "txl_engine_step_seconds", "txl_batch_size", "txl_step_tokens", "txl_queue_depth",
        "txl_sessions", "txl_session_memory_bytes", "txl_session_evictions_total", "txl_build_info"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name;
  }
  EXPECT_NE(text.find("method=\"Generate\""), std::string::npos);
  EXPECT_EQ(text.find(id), std::string::npos);  // never a session id as a label
  // Counters moved: tokens were generated.
  const size_t at = text.find("\ntxl_tokens_generated_total ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GE(std::stod(text.substr(at + 28)), 5.0);
}

// Regression: a Generate the client cancelled after tokens had streamed was
// counted as code="OK" in txl_requests_total.
TEST(ServerMetricsTest, CancelledCallsAreCountedAsCancelled) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto c = Connect(*server);
  const std::string id = NewSession(*c);
  {
    grpc::ClientContext ctx;
    auto stub = v1::TransformerXL::NewStub(grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
    auto reader = stub->Generate(&ctx, Gen(id, "cancel me", 5000));
    v1::GenerateResponse r;
    int received = 0;
    while (received < 3 && reader->Read(&r)) received += r.tokens_size();
    ctx.TryCancel();
    while (reader->Read(&r)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The server counts the call when its reactor finishes, after the client saw the end.
  const std::string cancelled = "txl_requests_total{code=\"CANCELLED\",method=\"Generate\"} 1";
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    text = testing::HttpGet(server->metrics_port, "/metrics");
    if (text.find(cancelled) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a counter, not a race
  }
  EXPECT_NE(text.find(cancelled), std::string::npos) << text;
  EXPECT_EQ(text.find("txl_requests_total{code=\"OK\",method=\"Generate\"}"), std::string::npos) << text;
}

// A session moves between servers: exported from one, imported into another
// of the same model, it continues exactly; other models and damaged bytes
// are refused with the reason.
TEST(SessionTransferTest, ExportImportContinuesExactlyAcrossServers) {
  auto a = StartServer();
  auto b = StartServer();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto ca = Connect(*a);
  auto cb = Connect(*b);
  const std::string id = NewSession(*ca);
  ASSERT_TRUE(Stream(*ca, Gen(id, "export me", 6)).status.ok());
  auto bytes = ca->ExportSession(id);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto moved = cb->ImportSession(v1::ImportSessionRequest(), *bytes);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->position(), ca->GetSession(id)->position());
  EXPECT_EQ(moved->mem_len(), ca->GetSession(id)->mem_len());
  EXPECT_FALSE(ca->GetSession(id)->busy());  // the export gave the session back
  const Generated here = Stream(*ca, Gen(id, " and on", 12));
  const Generated there = Stream(*cb, Gen(moved->session_id(), " and on", 12));
  ASSERT_TRUE(here.status.ok() && there.status.ok());
  EXPECT_EQ(here.ids, there.ids);
  EXPECT_EQ(here.positions, there.positions);

  v1::ImportSessionRequest same_id;
  same_id.set_session_id(moved->session_id());
  EXPECT_EQ(cb->ImportSession(same_id, *bytes).status().code(), absl::StatusCode::kAlreadyExists);
  std::string damaged = *bytes;
  damaged[damaged.size() / 2] ^= 0x01;
  auto bad = cb->ImportSession(v1::ImportSessionRequest(), damaged);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("damaged"), std::string::npos) << bad.status();
  EXPECT_EQ(cb->ImportSession(v1::ImportSessionRequest(), bytes->substr(0, 100)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ca->ExportSession("0123456789abcdef0123456789abcdef").status().code(), absl::StatusCode::kNotFound);
  // Regression: an import's window was not held to --max_mem_len, so a
  // client could import a session whose memory then grew past the limit.
  auto narrow = StartServer({"--max_mem_len=8", "--default_mem_len=8"});
  ASSERT_NE(narrow, nullptr);
  auto wide = Connect(*narrow)->ImportSession(v1::ImportSessionRequest(), *bytes);
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wide.status().message().find("max_mem_len=8"), std::string::npos) << wide.status();

  // Another model (other weights): FAILED_PRECONDITION naming both fingerprints.
  const std::string other = ModelPath() + ".other.pt";
  ASSERT_TRUE(WriteInitialCheckpoint(other, TinyConfig(), Tokenizer::Byte(), 4, 0.3).ok());
  std::string output;
  auto d = ServerProcess::Start(TXL_SERVER_BINARY, {"--model=" + other}, &output);
  ASSERT_NE(d, nullptr) << output;
  auto foreign = Connect(*d)->ImportSession(v1::ImportSessionRequest(), *bytes);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kFailedPrecondition);
  // The export names the version that made it (the file's stem, version 1) beside its fingerprint.
  const std::string stem = std::filesystem::path(ModelPath()).stem().string();
  EXPECT_NE(foreign.status().message().find("exported from model " + stem + "@1, fingerprint "), std::string::npos)
      << foreign.status();
  std::filesystem::remove(other);
}

}  // namespace
}  // namespace txl
