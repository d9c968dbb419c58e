// txl-server's security end to end: the real binary (serving the bundled
// model) with TLS, mutual TLS, bearer tokens, per-principal sessions and
// limits, driven through the C++ client library. The certificates (a CA, a
// server certificate for "localhost", a client certificate, and a second CA
// that signed neither) are made here with the openssl command-line tool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "client/load_generator.h"
#include "client/txl_client.h"
#include "tests/server/grpc/reflection_client.h"
#include "tests/server/grpc/server_process.h"

namespace txl {
namespace {

using testing::ServerProcess;
namespace fs = std::filesystem;

// Runs a shell command; its output goes to `log`. True on exit status 0.
bool Run(const std::string& command, const fs::path& log) {
  return std::system((command + " >>'" + log.string() + "' 2>&1").c_str()) == 0;
}

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Makes ca.pem, server.{pem,key} (CN and SAN DNS:localhost), client.{pem,key}
// (signed by ca) and other_ca.pem in `dir`. An error message, or "".
std::string MakeCertificates(const fs::path& dir) {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
    return "the openssl command-line tool is missing: install the 'openssl' package (scripts/install-deps.sh)";
  }
  const fs::path log = dir / "openssl.log";
  const std::string d = "'" + dir.string() + "/";
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::ofstream(dir / "server.ext") << "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n";
  std::ofstream(dir / "client.ext") << "extendedKeyUsage=clientAuth\n";
  const std::vector<std::string> steps = {
      "openssl req -x509 " + key + " -keyout " + d + "ca.key' -out " + d + "ca.pem' -days 2 -subj '/CN=txl test CA'",
      "openssl req -x509 " + key + " -keyout " + d + "other_ca.key' -out " + d +
          "other_ca.pem' -days 2 -subj '/CN=txl other CA'",
      "openssl req " + key + " -keyout " + d + "server.key' -out " + d + "server.csr' -subj '/CN=localhost'",
      "openssl x509 -req -in " + d + "server.csr' -CA " + d + "ca.pem' -CAkey " + d + "ca.key' -CAcreateserial -out " +
          d + "server.pem' -days 2 -extfile " + d + "server.ext'",
      "openssl req " + key + " -keyout " + d + "client.key' -out " + d + "client.csr' -subj '/CN=txl test client'",
      "openssl x509 -req -in " + d + "client.csr' -CA " + d + "ca.pem' -CAkey " + d + "ca.key' -CAcreateserial -out " +
          d + "client.pem' -days 2 -extfile " + d + "client.ext'",
  };
  for (const std::string& step : steps) {
    if (!Run(step, log)) return "failed: " + step + "\n" + ReadAll(log);
  }
  return "";
}

constexpr char kUnknownId[] = "0123456789abcdef0123456789abcdef";

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("txl_security_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    setup_error_ = MakeCertificates(dir_);
    if (!setup_error_.empty()) return;
    std::ofstream(dir_ / "tokens.txt") << "# principal per token\n"
                                          "tok-alice alice\n"
                                          "tok-bob bob\n"
                                          "tok-carol carol\n";
    std::string output;
    server_ = ServerProcess::Start(
                  TXL_SERVER_BINARY,
                  {"--tls_cert=" + (dir_ / "server.pem").string(), "--tls_key=" + (dir_ / "server.key").string(),
                   "--tls_client_ca=" + (dir_ / "ca.pem").string(), "--auth_tokens=" + (dir_ / "tokens.txt").string(),
                   "--max_sessions_per_principal=3", "--max_message_bytes=65536", "--max_input_tokens=1000",
                   "--max_new_tokens=50"},
                  &output)
                  .release();
    if (server_ == nullptr) setup_error_ = "txl-server did not start:\n" + output;
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    fs::remove_all(dir_);
  }
  void SetUp() override { ASSERT_TRUE(setup_error_.empty()) << setup_error_; }

  // Everything right: the CA, a client certificate and the principal's token.
  static ClientOptions Options(const std::string& token) {
    ClientOptions o;
    o.server = server_->address();
    o.timeout = absl::Seconds(30);
    o.token = token;
    o.tls_ca_file = (dir_ / "ca.pem").string();
    o.tls_cert_file = (dir_ / "client.pem").string();
    o.tls_key_file = (dir_ / "client.key").string();
    o.tls_server_name = "localhost";  // the certificate's name; the address is 127.0.0.1
    return o;
  }
  static std::unique_ptr<TxlClient> Client(const ClientOptions& o) {
    auto c = TxlClient::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  static std::unique_ptr<TxlClient> Client(const std::string& token) { return Client(Options(token)); }

  static fs::path dir_;
  static std::string setup_error_;
  static ServerProcess* server_;
};
fs::path SecurityTest::dir_;
std::string SecurityTest::setup_error_;
ServerProcess* SecurityTest::server_ = nullptr;

v1::GenerateRequest Gen(const std::string& session, const std::string& text, int max_new) {
  v1::GenerateRequest r;
  r.set_session_id(session);
  if (!text.empty()) r.mutable_input()->set_text(text);
  r.set_max_new_tokens(max_new);
  return r;
}

absl::Status Generate(TxlClient& c, const v1::GenerateRequest& r) {
  return c.Generate(r, [](const v1::GenerateResponse&) {});
}

v1::ScoreRequest ScoreReq(const std::string& session, const std::string& text, bool commit) {
  v1::ScoreRequest r;
  r.set_session_id(session);
  r.mutable_input()->set_text(text);
  r.set_commit(commit);
  return r;
}

v1::ForkSessionRequest ForkReq(const std::string& session) {
  v1::ForkSessionRequest r;
  r.set_session_id(session);
  return r;
}

TEST_F(SecurityTest, TlsWithTheRightCaClientCertificateAndToken) {
  auto c = Client("tok-alice");
  auto info = c->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->n_token(), 0);
  EXPECT_EQ(*c->Health(), "SERVING");
  EXPECT_NE(server_->output().find("TLS, client certificates required (mutual TLS), 3 bearer token(s)"),
            std::string::npos)
      << server_->output();
}

// txl-client bench's load generator carries the token and TLS on every call,
// its own Generate stream included.
TEST_F(SecurityTest, LoadGeneratorRunsOverTlsWithAToken) {
  LoadGeneratorConfig config;
  config.server = server_->address();
  config.security = Options("tok-carol");
  config.sessions = 2;
  config.turns = 2;
  config.input_tokens = 4;
  config.new_tokens = 3;
  auto report = RunLoad(config);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->errors_total(), 0);
  EXPECT_EQ(report->generated_tokens, 2 * 2 * 3);

  config.security.token = "not-a-token";
  auto refused = RunLoad(config);
  EXPECT_TRUE(absl::IsUnauthenticated(refused.status())) << refused.status();
}

TEST_F(SecurityTest, WithoutClientCertificateOrTrustedCaTheConnectionFails) {
  ClientOptions no_cert = Options("tok-alice");
  no_cert.tls_cert_file.clear();
  no_cert.tls_key_file.clear();
  ClientOptions wrong_ca = Options("tok-alice");
  wrong_ca.tls_ca_file = (dir_ / "other_ca.pem").string();
  ClientOptions wrong_name = Options("tok-alice");
  wrong_name.tls_server_name = "not-localhost";
  ClientOptions plaintext;
  plaintext.server = server_->address();
  plaintext.token = "tok-alice";
  for (const auto& [name, o] :
       std::vector<std::pair<std::string, ClientOptions>>{{"no client certificate", no_cert},
                                                          {"server not signed by the trusted CA", wrong_ca},
                                                          {"certificate for another name", wrong_name},
                                                          {"plaintext", plaintext}}) {
    SCOPED_TRACE(name);
    auto c = Client(o);
    EXPECT_EQ(c->Info().status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(c->Health().status().code(), absl::StatusCode::kUnavailable);
  }
}

TEST_F(SecurityTest, MissingOrUnknownTokenIsUnauthenticated) {
  auto none = Client("");
  auto bad = Client("tok-mallory");
  for (TxlClient* c : {none.get(), bad.get()}) {
    const std::string expected = c == none.get() ? "missing credentials" : "invalid bearer token";
    SCOPED_TRACE(expected);
    const auto check = [&](const absl::Status& s) {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
      EXPECT_NE(s.message().find(expected), std::string::npos) << s;
      EXPECT_EQ(s.message().find("tok-mallory"), std::string::npos) << s;  // never echoed
    };
    check(c->Info().status());
    check(c->CreateSession(v1::CreateSessionRequest()).status());
    check(c->GetSession(kUnknownId).status());
    check(c->ListSessions().status());
    check(c->DeleteSession(kUnknownId));
    check(c->ForkSession(ForkReq(kUnknownId)).status());
    check(c->RewindSession(kUnknownId, 0).status());
    check(Generate(*c, Gen("", "hello", 2)));
    check(c->Score(ScoreReq("", "hello", false)).status());
    auto conversation = c->Converse("");
    check(conversation->Turn(Gen("", "hello", 2), [](const v1::GenerateResponse&) {}));
    // Authentication comes first: a bad argument does not tell anything either.
    v1::CreateSessionRequest bad_args;
    bad_args.set_mem_len(-1);
    check(c->CreateSession(bad_args).status());
  }
  // A token in a different form than "Bearer <token>".
  auto stub = v1::TransformerXL::NewStub(grpc::CreateCustomChannel(
      server_->address(),
      grpc::SslCredentials({ReadAll(dir_ / "ca.pem"), ReadAll(dir_ / "client.key"), ReadAll(dir_ / "client.pem")}), [] {
        grpc::ChannelArguments a;
        a.SetSslTargetNameOverride("localhost");
        return a;
      }()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "tok-alice");
  v1::ModelInfo out;
  grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("Bearer <token>"), std::string::npos) << s.error_message();
}

TEST_F(SecurityTest, HealthAndReflectionNeedNoToken) {
  auto c = Client("");
  EXPECT_EQ(*c->Health(), "SERVING");
  bool ok = false;
  const std::vector<std::string> names = testing::ListedServices(
      grpc::CreateCustomChannel(
          server_->address(),
          grpc::SslCredentials({ReadAll(dir_ / "ca.pem"), ReadAll(dir_ / "client.key"), ReadAll(dir_ / "client.pem")}),
          [] {
            grpc::ChannelArguments a;
            a.SetSslTargetNameOverride("localhost");
            return a;
          }()),
      &ok);
  EXPECT_NE(std::find(names.begin(), names.end(), "txl.v1.TransformerXL"), names.end());
  EXPECT_TRUE(ok);
}

TEST_F(SecurityTest, AnotherPrincipalsSessionIsNotFoundWhateverItTries) {
  auto alice = Client("tok-alice");
  auto bob = Client("tok-bob");
  auto created = alice->CreateSession(v1::CreateSessionRequest());
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string id = created->session_id();
  ASSERT_TRUE(Generate(*alice, Gen(id, "To be, or not", 3)).ok());
  auto alice_fork = alice->ForkSession(ForkReq(id));  // a fork belongs to its caller, the owner
  ASSERT_TRUE(alice_fork.ok()) << alice_fork.status();
  auto before = alice->GetSession(id);  // GetSession does not touch last_used
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_GT(before->position(), 0);

  // Exactly what an id that does not exist gets, with the id in it.
  const absl::Status unknown = bob->GetSession(kUnknownId).status();
  ASSERT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  for (const std::string& target : {id, alice_fork->session_id()}) {
    SCOPED_TRACE(target);
    std::string expected(unknown.message());
    expected.replace(expected.find(kUnknownId), std::string(kUnknownId).size(), target);
    const auto not_found = [&](const absl::Status& s) {
      EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
      EXPECT_EQ(s.message(), expected);
    };
    not_found(bob->GetSession(target).status());
    not_found(Generate(*bob, Gen(target, " more", 2)));
    not_found(Generate(*bob, Gen(target, "", 2)));
    not_found(bob->Score(ScoreReq(target, " be", true)).status());
    not_found(bob->Score(ScoreReq(target, " be", false)).status());
    not_found(bob->ForkSession(ForkReq(target)).status());
    not_found(bob->RewindSession(target, 0).status());
    not_found(bob->DeleteSession(target));
    auto conversation = bob->Converse(target);
    not_found(conversation->Turn(Gen(target, " more", 2), [](const v1::GenerateResponse&) {}));
  }
  auto bobs = bob->ListSessions();
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  for (const auto& s : bobs->sessions()) {
    EXPECT_NE(s.session_id(), id);
    EXPECT_NE(s.session_id(), alice_fork->session_id());
  }
  auto alices = alice->ListSessions();
  ASSERT_TRUE(alices.ok()) << alices.status();
  EXPECT_EQ(alices->sessions_size(), 2);

  // Alice's session is as she left it.
  auto after = alice->GetSession(id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->position(), before->position());
  EXPECT_EQ(after->memory_tokens(), before->memory_tokens());
  EXPECT_EQ(after->last_used().seconds(), before->last_used().seconds());
  EXPECT_EQ(after->last_used().nanos(), before->last_used().nanos());
  EXPECT_TRUE(Generate(*alice, Gen(id, " more", 2)).ok());
  EXPECT_TRUE(alice->DeleteSession(id).ok());
  EXPECT_TRUE(alice->DeleteSession(alice_fork->session_id()).ok());
}

TEST_F(SecurityTest, SessionLimitIsPerPrincipal) {
  auto carol = Client("tok-carol");
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto s = carol->CreateSession(v1::CreateSessionRequest());
    ASSERT_TRUE(s.ok()) << s.status();
    ids.push_back(s->session_id());
  }
  auto fourth = carol->CreateSession(v1::CreateSessionRequest());
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fourth.status().message().find("max_sessions_per_principal=3"), std::string::npos) << fourth.status();
  // Throw-away sessions and forks count too.
  EXPECT_EQ(Generate(*carol, Gen("", "hello", 1)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(carol->ForkSession(ForkReq(ids[0])).status().code(), absl::StatusCode::kResourceExhausted);
  // Others are not held back by carol's sessions.
  auto bob = Client("tok-bob");
  auto bobs = bob->CreateSession(v1::CreateSessionRequest());
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_TRUE(bob->DeleteSession(bobs->session_id()).ok());
  // A deleted session frees its slot.
  ASSERT_TRUE(carol->DeleteSession(ids.back()).ok());
  EXPECT_TRUE(Generate(*carol, Gen("", "hello", 1)).ok());
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_TRUE(carol->DeleteSession(ids[i]).ok());
}

TEST_F(SecurityTest, TooLargeMessageIsResourceExhausted) {
  auto alice = Client("tok-alice");
  // 70 000 bytes: over --max_message_bytes=65536; gRPC refuses it before the service sees it.
  const absl::Status s = alice->Score(ScoreReq("", std::string(70000, 'a'), false)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // Under the byte limit, the token and generation limits answer with the field and the limit.
  const absl::Status input = Generate(*alice, Gen("", std::string(1001, 'a'), 1));
  EXPECT_EQ(input.code(), absl::StatusCode::kInvalidArgument) << input;
  EXPECT_NE(input.message().find("input: 1001 tokens, more than the limit of 1000"), std::string::npos) << input;
  const absl::Status new_tokens = Generate(*alice, Gen("", "a", 51));
  EXPECT_EQ(new_tokens.code(), absl::StatusCode::kInvalidArgument) << new_tokens;
  EXPECT_NE(new_tokens.message().find("max_new_tokens: must be in [1, 50]"), std::string::npos) << new_tokens;
  EXPECT_TRUE(Generate(*alice, Gen("", std::string(1000, 'a'), 1)).ok());
}

// Startup refuses a bad security configuration with one line naming the flag.
TEST(SecurityFlagsTest, BadFilesFailAtStartupNamingTheFlag) {
  const fs::path dir = fs::temp_directory_path() / ("txl_security_flags_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "not_pem.txt") << "hello\n";
  std::ofstream(dir / "malformed_tokens.txt") << "# ok\ntok-a alice\nonly-one-field\n";
  std::ofstream(dir / "duplicate_tokens.txt") << "tok-a alice\ntok-a bob\n";
  const std::string missing = (dir / "missing.pem").string();
  const std::string not_pem = (dir / "not_pem.txt").string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tls_cert=" + missing, "--tls_key=" + not_pem}, "--tls_cert: " + missing + ": cannot open"},
      {{"--tls_cert=" + not_pem, "--tls_key=" + not_pem}, "--tls_cert: " + not_pem + " holds no PEM certificate"},
      {{"--tls_cert=" + not_pem}, "--tls_cert needs --tls_key"},
      {{"--tls_key=" + not_pem}, "--tls_key needs --tls_cert"},
      {{"--tls_client_ca=" + not_pem}, "--tls_client_ca needs --tls_cert and --tls_key"},
      {{"--auth_tokens=" + missing}, "--auth_tokens: " + missing + ": cannot open"},
      {{"--auth_tokens=" + (dir / "malformed_tokens.txt").string()},
       "--auth_tokens: " + (dir / "malformed_tokens.txt").string() + ":3: expected 'TOKEN PRINCIPAL'"},
      {{"--auth_tokens=" + (dir / "duplicate_tokens.txt").string()},
       "--auth_tokens: " + (dir / "duplicate_tokens.txt").string() + ":2: duplicate token (first on line 1)"},
      {{"--max_sessions_per_principal=-1"}, "--max_sessions_per_principal must be >= 0"},
      {{"--max_message_bytes=0"}, "--max_message_bytes must be in [1, "},
  };
  for (const auto& [flags, message] : cases) {
    std::string output;
    auto p = ServerProcess::Start(TXL_SERVER_BINARY, flags, &output);
    EXPECT_EQ(p, nullptr) << message;
    EXPECT_NE(output.find("txl-server: " + message), std::string::npos) << output;
    EXPECT_EQ(output.find("tok-a"), std::string::npos) << output;  // a token file's secrets stay out of logs
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace txl
