// ServiceContext: what every call of the gRPC service shares (the server's
// parts, the request validator) and the steps every call opens with: who is
// calling, which session it names, taking that session (adopting it from
// the state store if a replica that is gone held it), and one way to answer
// a unary call. The reactors of the call families (session_calls.cc,
// generate_calls.cc, score_call.cc, transfer_calls.cc) use only this.
#ifndef TXL_SERVER_API_CALL_CONTEXT_H_
#define TXL_SERVER_API_CALL_CONTEXT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "proto/txl/v1/txl.pb.h"
#include "server/api/auth.h"
#include "server/api/request_validation.h"
#include "server/api/service_config.h"
#include "server/batching/scheduler.h"
#include "server/durability/session_journal.h"
#include "server/engine/engine.h"
#include "server/metrics/service_metrics.h"
#include "server/sessions/session_table.h"

namespace txl {

grpc::Status ToGrpcStatus(const absl::Status& status);
void FillSession(const SessionInfo& info, v1::Session* out);

// The caller and the session a call names.
struct CallTarget {
  std::string principal;
  std::string session_id;  // may be empty where the call allows it
};

struct ServiceContext {
  ServiceConfig config;
  ModelConfig model;
  Tokenizer tokenizer;
  Engine* engine;
  SessionTable* table;
  Scheduler* scheduler;
  ServiceMetrics* metrics;     // may be null
  const BearerTokens* tokens;  // null: no authentication
  RequestValidator validator;
  SessionJournal* journal;  // null: no state store

  // Who is calling: the principal of the call's bearer token, or the
  // anonymous principal "" when the server has no tokens.
  absl::StatusOr<std::string> Principal(grpc::CallbackServerContext* ctx) const;
  // The txl-session-id metadata of the call, if it has one.
  static std::optional<std::string> MetadataSessionId(grpc::CallbackServerContext* ctx);
  // The principal, and the session named by `field` or the metadata; it is
  // required (INVALID_ARGUMENT "session_id: required" when neither names one).
  absl::StatusOr<CallTarget> NamedSession(grpc::CallbackServerContext* ctx, const std::string& field) const;

  // A Generate (or Converse turn) and a Score, checked with the call's
  // metadata (request_validation.h).
  absl::StatusOr<GenerateArgs> ValidGenerate(grpc::CallbackServerContext* ctx, const v1::GenerateRequest& req) const;
  absl::StatusOr<ScoreArgs> ValidScore(grpc::CallbackServerContext* ctx, const v1::ScoreRequest& req) const;

  // A throw-away session (empty id) or the named one, acquired for `principal`.
  absl::StatusOr<SessionLease> Lease(const std::string& principal, const std::string& id, bool* throwaway) const;
  // Gives a lease back unchanged (a throw-away session is dropped).
  void GiveBack(SessionLease lease, bool throwaway) const;

  // Runs `attempt`, which either fails or sees the request through. When it
  // fails with NOT_FOUND for a named session and there is a state store, the
  // session may be one a replica that is gone served: adopt it (on the
  // engine thread; reactors never wait for the state store) and try once more.
  // `fail` gets the error that ends the request.
  void WithAdoption(const std::string& principal, const std::string& id, std::function<absl::Status()> attempt,
                    std::function<void(absl::Status)> fail) const;

  // Finishes a unary call with `s` (OK included) and counts it: the one way
  // a unary call ends.
  void Answer(grpc::ServerUnaryReactor* reactor, const char* method, const absl::Status& s) const;
  void Count(const char* method, const grpc::Status& s) const;
  std::string TokenText(int id) const;
};

// A unary call: `body` either fails (the call is answered with its error) or
// answers the call itself, now or later (ServiceContext::Answer).
grpc::ServerUnaryReactor* UnaryCall(const ServiceContext* c, grpc::CallbackServerContext* ctx, const char* method,
                                    const std::function<absl::Status(grpc::ServerUnaryReactor*)>& body);

}  // namespace txl

#endif  // TXL_SERVER_API_CALL_CONTEXT_H_
