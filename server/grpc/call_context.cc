#include "server/grpc/call_context.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace txl {
grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

grpc::Status AbandonedCallStatus(std::chrono::system_clock::time_point deadline,
                                 std::chrono::system_clock::time_point now) {
  // No deadline is the time point's maximum: subtracting the slack cannot wrap.
  if (deadline - kDeadlineSlack <= now)
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the deadline expired");
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
}

absl::StatusOr<std::string> ServiceContext::Principal(grpc::CallbackServerContext* ctx) const {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  std::optional<absl::string_view> header;
  if (it != md.end()) header = absl::string_view(it->second.data(), it->second.size());
  return Authenticate(header);
}

std::optional<std::string> ServiceContext::MetadataSessionId(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("txl-session-id");
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

absl::StatusOr<CallTarget> ServiceContext::NamedSession(grpc::CallbackServerContext* ctx,
                                                        const std::string& field) const {
  CallTarget target;
  ASSIGN_OR_RETURN(target.principal, Principal(ctx));
  const std::optional<std::string> md = MetadataSessionId(ctx);
  ASSIGN_OR_RETURN(target.session_id, RequiredSession(field, md ? &*md : nullptr));
  return target;
}

absl::StatusOr<GenerateArgs> ServiceContext::ValidGenerate(grpc::CallbackServerContext* ctx,
                                                           const std::string& principal,
                                                           const v1::GenerateRequest& req) const {
  const std::optional<std::string> md = MetadataSessionId(ctx);
  return CheckGenerate(principal, req, md ? &*md : nullptr);
}

absl::StatusOr<ScoreArgs> ServiceContext::ValidScore(grpc::CallbackServerContext* ctx, const std::string& principal,
                                                     const v1::ScoreRequest& req) const {
  const std::optional<std::string> md = MetadataSessionId(ctx);
  return CheckScore(principal, req, md ? &*md : nullptr);
}

void ServiceContext::Count(const char* method, const grpc::Status& s) const {
  if (metrics == nullptr) return;
  // The metrics' code label: gRPC's codes are absl's, numbered alike.
  std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code()));
  metrics->OnRequest(method, name.empty() ? "UNKNOWN" : name);
}

void ServiceContext::Answer(grpc::ServerUnaryReactor* reactor, const char* method, const absl::Status& s) const {
  grpc::Status g = ToGrpcStatus(s);
  Count(method, g);
  reactor->Finish(g);
}

SessionDone ServiceContext::AnswerSession(grpc::ServerUnaryReactor* reactor, const char* method,
                                          v1::Session* out) const {
  return [this, reactor, method, out](absl::StatusOr<SessionInfo> info) {
    if (info.ok()) FillSession(*info, out);
    Answer(reactor, method, info.status());
  };
}

grpc::ServerUnaryReactor* UnaryCall(const ServiceContext* c, grpc::CallbackServerContext* ctx, const char* method,
                                    const std::function<absl::Status(grpc::ServerUnaryReactor*)>& body) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = body(reactor); !s.ok()) c->Answer(reactor, method, s);
  return reactor;
}

}  // namespace txl
