// ServiceContext: what every call of the gRPC service shares: the service
// core (server/core/service_core.h: the parts, validation, leases, adoption,
// the session operations) and the steps every call opens with, read from its
// metadata: who is calling, which session it names, and one way to answer a
// unary call. The reactors of the call families (session_calls.cc,
// generate_calls.cc, score_call.cc, transfer_calls.cc) use only this.
#ifndef TXL_SERVER_GRPC_CALL_CONTEXT_H_
#define TXL_SERVER_GRPC_CALL_CONTEXT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/txl/v1/txl.pb.h"
#include "server/core/responses.h"
#include "server/core/service_core.h"

namespace txl {

grpc::Status ToGrpcStatus(const absl::Status& status);

// How far ahead of the server's deadline a client's may run: the server
// starts its clock when the request arrives, so the client's library gives
// up that much earlier and cancels, which the server cannot tell from any
// other cancel.
inline constexpr std::chrono::milliseconds kDeadlineSlack{250};
// The status a call the client abandoned is counted with: DEADLINE_EXCEEDED
// when `deadline` had passed at `now`, or was within kDeadlineSlack of it;
// CANCELLED otherwise.
grpc::Status AbandonedCallStatus(std::chrono::system_clock::time_point deadline,
                                 std::chrono::system_clock::time_point now);

// The caller and the session a call names.
struct CallTarget {
  std::string principal;
  std::string session_id;  // may be empty where the call allows it
};

// The gRPC service's view of the core: the core (server/core/service_core.h)
// and the steps every gRPC call opens with, read from the call's metadata.
struct ServiceContext : public ServiceCore {
  explicit ServiceContext(ServiceParts parts) : ServiceCore(std::move(parts)) {}

  // Who is calling: the principal of the call's bearer token, or the
  // anonymous principal "" when the server has no tokens.
  absl::StatusOr<std::string> Principal(grpc::CallbackServerContext* ctx) const;
  // The txl-session-id metadata of the call, if it has one.
  static std::optional<std::string> MetadataSessionId(grpc::CallbackServerContext* ctx);
  // The principal, and the session named by `field` or the metadata; it is
  // required (INVALID_ARGUMENT "session_id: required" when neither names one).
  absl::StatusOr<CallTarget> NamedSession(grpc::CallbackServerContext* ctx, const std::string& field) const;

  // A Generate (or Converse turn) and a Score by `principal`, checked with
  // the call's metadata for the version each runs on (ServiceCore::CheckGenerate).
  absl::StatusOr<GenerateArgs> ValidGenerate(grpc::CallbackServerContext* ctx, const std::string& principal,
                                             const v1::GenerateRequest& req) const;
  absl::StatusOr<ScoreArgs> ValidScore(grpc::CallbackServerContext* ctx, const std::string& principal,
                                       const v1::ScoreRequest& req) const;

  // Finishes a unary call with `s` (OK included) and counts it: the one way
  // a unary call ends.
  void Answer(grpc::ServerUnaryReactor* reactor, const char* method, const absl::Status& s) const;
  void Count(const char* method, const grpc::Status& s) const;
  // A callback that answers a unary call with a session (into `out`) or its error.
  SessionDone AnswerSession(grpc::ServerUnaryReactor* reactor, const char* method, v1::Session* out) const;
};

// A unary call: `body` either fails (the call is answered with its error) or
// answers the call itself, now or later (ServiceContext::Answer).
grpc::ServerUnaryReactor* UnaryCall(const ServiceContext* c, grpc::CallbackServerContext* ctx, const char* method,
                                    const std::function<absl::Status(grpc::ServerUnaryReactor*)>& body);

}  // namespace txl

#endif  // TXL_SERVER_GRPC_CALL_CONTEXT_H_
