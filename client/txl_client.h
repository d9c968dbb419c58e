// TxlClient: the C++ client library for txl.v1.TransformerXL. Every call
// that names a session also sends it as "txl-session-id" metadata, so a
// proxy can route it to the replica that holds the session. With a token,
// every call carries "authorization: Bearer <token>" (docs/OPERATIONS.md,
// Security).
//
// Threading: a TxlClient may be shared by threads; each call is independent.
#ifndef TXL_CLIENT_TXL_CLIENT_H_
#define TXL_CLIENT_TXL_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/txl/v1/txl.grpc.pb.h"

namespace txl {

struct ClientOptions {
  std::string server = "127.0.0.1:50051";
  absl::Duration timeout = absl::Seconds(60);  // per call; streams included
  // Bearer token for a server with --auth_tokens (empty: none sent).
  std::string token;
  // TLS: on when `tls` or any tls_* option is set. PEM files:
  std::string tls_ca_file;    // roots that verify the server (empty: gRPC's default roots)
  std::string tls_cert_file;  // client certificate chain, for mutual TLS (with tls_key_file)
  std::string tls_key_file;
  std::string tls_server_name;  // the name to verify instead of the address's host (tests, IPs)
  bool tls = false;
};

// An open Converse stream: one turn at a time.
class Conversation {
 public:
  virtual ~Conversation() = default;
  // Sends one turn and delivers its responses until the turn's last one.
  virtual absl::Status Turn(const v1::GenerateRequest& request,
                            const std::function<void(const v1::GenerateResponse&)>& on_response) = 0;
  // Ends the stream and returns its status.
  virtual absl::Status Close() = 0;
};

class TxlClient {
 public:
  // INVALID_ARGUMENT naming the option when a TLS file cannot be read. No
  // connection is made here: an unreachable server or a failed handshake
  // shows as UNAVAILABLE on the first call.
  static absl::StatusOr<std::unique_ptr<TxlClient>> Create(const ClientOptions& options);

  // `model`: NAME or NAME@VERSION ("": the server's only model).
  absl::StatusOr<v1::ModelInfo> Info(const std::string& model = "");
  // The model repository: every version and its state; explicit load and unload.
  absl::StatusOr<v1::ListModelsResponse> ListModels();
  absl::StatusOr<v1::ListModelsResponse> LoadModel(const std::string& name);
  absl::StatusOr<v1::ListModelsResponse> UnloadModel(const std::string& name);
  // Picks a random session id when the request has none (see the proto).
  absl::StatusOr<v1::Session> CreateSession(const v1::CreateSessionRequest& request);
  absl::StatusOr<v1::Session> GetSession(const std::string& id);
  absl::StatusOr<v1::ListSessionsResponse> ListSessions();
  absl::Status DeleteSession(const std::string& id);
  absl::StatusOr<v1::Session> ForkSession(const v1::ForkSessionRequest& request);
  absl::StatusOr<v1::Session> RewindSession(const std::string& id, int64_t position);
  // `model`: NAME or NAME@VERSION of the version to rebuild the session on.
  absl::StatusOr<v1::Session> MigrateSession(const std::string& id, const std::string& model);
  // A session's exported bytes (ExportSession's chunks, joined).
  absl::StatusOr<std::string> ExportSession(const std::string& id);
  // A new session from exported bytes, sent in chunks; `settings` carries
  // the id (picked here when empty, as CreateSession does), ttl and labels.
  absl::StatusOr<v1::Session> ImportSession(v1::ImportSessionRequest settings, const std::string& data);
  // Calls on_response for every streamed response; returns the call's status.
  // `ctx`: a fresh context of the caller's for the call (Prepare is applied to
  // it), so that another thread can TryCancel it; null: one of its own.
  absl::Status Generate(const v1::GenerateRequest& request,
                        const std::function<void(const v1::GenerateResponse&)>& on_response,
                        grpc::ClientContext* ctx = nullptr);
  absl::StatusOr<v1::ScoreResponse> Score(const v1::ScoreRequest& request);
  std::unique_ptr<Conversation> Converse(const std::string& session_id);
  // "SERVING", "NOT_SERVING", ... of grpc.health.v1 for `service` ("" = server).
  absl::StatusOr<std::string> Health(const std::string& service = "");

  // The status of a gRPC call as an absl::Status (same code and message).
  static absl::Status FromGrpc(const grpc::Status& s);

  // The channel (TLS as configured) and the metadata every call carries
  // (session id, token, deadline), for callers that drive a stub themselves.
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  void Prepare(grpc::ClientContext* ctx, const std::string& session_id) const;

 private:
  explicit TxlClient(const ClientOptions& options, std::shared_ptr<grpc::Channel> channel);

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TransformerXL::Stub> stub_;
};

}  // namespace txl

#endif  // TXL_CLIENT_TXL_CLIENT_H_
