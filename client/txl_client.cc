#include "client/txl_client.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/read_file.h"
#include "base/status_macros.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace txl {

absl::Status TxlClient::FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

namespace {

// A PEM file's content; empty path: empty content. Errors name the option, and are
// INVALID_ARGUMENT whatever the system said: the caller's options are at fault.
absl::StatusOr<std::string> ReadFileOption(const char* option, const std::string& path) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(option, ": ", text.status().message()));
  return text;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TxlClient>> TxlClient::Create(const ClientOptions& options) {
  if (options.server.empty()) return absl::InvalidArgumentError("server: address required");
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file: give both or neither");
  }
  const bool tls =
      options.tls || !options.tls_ca_file.empty() || !options.tls_cert_file.empty() || !options.tls_server_name.empty();
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFileOption("tls_ca_file", options.tls_ca_file));
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadFileOption("tls_cert_file", options.tls_cert_file));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadFileOption("tls_key_file", options.tls_key_file));
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  auto channel = grpc::CreateCustomChannel(options.server, credentials, args);
  return std::unique_ptr<TxlClient>(new TxlClient(options, std::move(channel)));
}

TxlClient::TxlClient(const ClientOptions& options, std::shared_ptr<grpc::Channel> channel)
    : options_(options), channel_(std::move(channel)), stub_(v1::TransformerXL::NewStub(channel_)) {}

void TxlClient::Prepare(grpc::ClientContext* ctx, const std::string& session_id) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.timeout)));
  if (!session_id.empty()) ctx->AddMetadata("txl-session-id", session_id);
  // Plain metadata rather than gRPC call credentials, which refuse to travel
  // without TLS: a server behind a TLS-terminating proxy still needs the token.
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
}

absl::StatusOr<v1::ModelInfo> TxlClient::Info(const std::string& model) {
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  v1::GetModelInfoRequest req;
  req.set_model(model);
  v1::ModelInfo out;
  grpc::Status s = stub_->GetModelInfo(&ctx, req, &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

absl::StatusOr<v1::ListModelsResponse> TxlClient::ListModels() {
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  v1::ListModelsResponse out;
  grpc::Status s = stub_->ListModels(&ctx, v1::ListModelsRequest(), &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

absl::StatusOr<v1::ListModelsResponse> TxlClient::LoadModel(const std::string& name) {
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  v1::LoadModelRequest req;
  req.set_name(name);
  v1::ListModelsResponse out;
  grpc::Status s = stub_->LoadModel(&ctx, req, &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

absl::StatusOr<v1::ListModelsResponse> TxlClient::UnloadModel(const std::string& name) {
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  v1::UnloadModelRequest req;
  req.set_name(name);
  v1::ListModelsResponse out;
  grpc::Status s = stub_->UnloadModel(&ctx, req, &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

namespace {

// 32 lowercase hex characters from the OS entropy source.
std::string NewSessionId() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&id, "%08x", rd());
  return id;
}

}  // namespace

absl::StatusOr<v1::Session> TxlClient::CreateSession(const v1::CreateSessionRequest& request) {
  // The client picks the id, so a proxy routing on txl-session-id sends the
  // creation where the session's later calls will go.
  v1::CreateSessionRequest req = request;
  if (req.session_id().empty()) req.set_session_id(NewSessionId());
  grpc::ClientContext ctx;
  Prepare(&ctx, req.session_id());
  v1::Session out;
  grpc::Status s = stub_->CreateSession(&ctx, req, &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

absl::StatusOr<v1::Session> TxlClient::GetSession(const std::string& id) {
  grpc::ClientContext ctx;
  Prepare(&ctx, id);
  v1::GetSessionRequest req;
  req.set_session_id(id);
  v1::Session out;
  grpc::Status s = stub_->GetSession(&ctx, req, &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

absl::StatusOr<v1::ListSessionsResponse> TxlClient::ListSessions() {
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  v1::ListSessionsResponse out;
  grpc::Status s = stub_->ListSessions(&ctx, v1::ListSessionsRequest(), &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

absl::Status TxlClient::DeleteSession(const std::string& id) {
  grpc::ClientContext ctx;
  Prepare(&ctx, id);
  v1::DeleteSessionRequest req;
  req.set_session_id(id);
  v1::DeleteSessionResponse out;
  return FromGrpc(stub_->DeleteSession(&ctx, req, &out));
}

absl::StatusOr<v1::Session> TxlClient::ForkSession(const v1::ForkSessionRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, request.session_id());
  v1::Session out;
  grpc::Status s = stub_->ForkSession(&ctx, request, &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

absl::StatusOr<v1::Session> TxlClient::RewindSession(const std::string& id, int64_t position) {
  grpc::ClientContext ctx;
  Prepare(&ctx, id);
  v1::RewindSessionRequest req;
  req.set_session_id(id);
  req.set_position(position);
  v1::Session out;
  grpc::Status s = stub_->RewindSession(&ctx, req, &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

absl::StatusOr<v1::Session> TxlClient::MigrateSession(const std::string& id, const std::string& model) {
  grpc::ClientContext ctx;
  Prepare(&ctx, id);
  v1::MigrateSessionRequest req;
  req.set_session_id(id);
  req.set_model(model);
  v1::Session out;
  grpc::Status s = stub_->MigrateSession(&ctx, req, &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

absl::StatusOr<std::string> TxlClient::ExportSession(const std::string& id) {
  grpc::ClientContext ctx;
  Prepare(&ctx, id);
  v1::ExportSessionRequest req;
  req.set_session_id(id);
  auto reader = stub_->ExportSession(&ctx, req);
  std::string data;
  v1::SessionChunk chunk;
  while (reader->Read(&chunk)) data += chunk.data();
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpc(s);
  return data;
}

absl::StatusOr<v1::Session> TxlClient::ImportSession(v1::ImportSessionRequest settings, const std::string& data) {
  if (settings.session_id().empty()) settings.set_session_id(NewSessionId());
  grpc::ClientContext ctx;
  Prepare(&ctx, settings.session_id());
  v1::Session out;
  auto writer = stub_->ImportSession(&ctx, &out);
  constexpr size_t kChunk = 1 << 20;
  size_t at = 0;
  do {
    settings.set_data(data.substr(at, kChunk));
    at += kChunk;
    if (!writer->Write(settings)) break;  // the server ended the call: Finish says why
    settings.Clear();
  } while (at < data.size());
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!s.ok()) return FromGrpc(s);
  return out;
}

absl::Status TxlClient::Generate(const v1::GenerateRequest& request,
                                 const std::function<void(const v1::GenerateResponse&)>& on_response,
                                 grpc::ClientContext* ctx) {
  grpc::ClientContext own;
  if (ctx == nullptr) ctx = &own;
  Prepare(ctx, request.session_id());
  auto reader = stub_->Generate(ctx, request);
  v1::GenerateResponse r;
  while (reader->Read(&r)) on_response(r);
  return FromGrpc(reader->Finish());
}

absl::StatusOr<v1::ScoreResponse> TxlClient::Score(const v1::ScoreRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, request.session_id());
  v1::ScoreResponse out;
  grpc::Status s = stub_->Score(&ctx, request, &out);
  if (!s.ok()) return FromGrpc(s);
  return out;
}

namespace {

class StreamConversation : public Conversation {
 public:
  // `prepare` sets the deadline (ClientOptions.timeout, for the whole stream) and metadata.
  StreamConversation(v1::TransformerXL::Stub* stub, const std::function<void(grpc::ClientContext*)>& prepare) {
    prepare(&ctx_);
    stream_ = stub->Converse(&ctx_);
  }
  absl::Status Turn(const v1::GenerateRequest& request,
                    const std::function<void(const v1::GenerateResponse&)>& on_response) override {
    if (!stream_->Write(request)) return Close();
    v1::GenerateResponse r;
    while (stream_->Read(&r)) {
      on_response(r);
      if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) return absl::OkStatus();
    }
    return Close();
  }
  absl::Status Close() override {
    if (closed_) return status_;
    closed_ = true;
    stream_->WritesDone();
    v1::GenerateResponse drain;
    while (stream_->Read(&drain)) {
    }
    status_ = TxlClient::FromGrpc(stream_->Finish());
    return status_;
  }
  ~StreamConversation() override { (void)Close(); }  // nobody is left to read the status

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::GenerateRequest, v1::GenerateResponse>> stream_;
  bool closed_ = false;
  absl::Status status_;
};

}  // namespace

std::unique_ptr<Conversation> TxlClient::Converse(const std::string& session_id) {
  return std::make_unique<StreamConversation>(stub_.get(), [&](grpc::ClientContext* ctx) { Prepare(ctx, session_id); });
}

absl::StatusOr<std::string> TxlClient::Health(const std::string& service) {
  grpc::ClientContext ctx;
  Prepare(&ctx, "");
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse out;
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::Status s = stub->Check(&ctx, req, &out);
  if (!s.ok()) return FromGrpc(s);
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(out.status());
}

}  // namespace txl
