// The unary calls on sessions: CreateSession, GetSession,
// ListSessions, DeleteSession, ForkSession, RewindSession. Each either fails at once or
// answers itself (now, or once the journal or the engine thread is done).
#include <memory>

#include "base/status_macros.h"
#include "server/grpc/call_context.h"
#include "server/grpc/service.h"

namespace txl {

grpc::ServerUnaryReactor* TxlService::CreateSession(grpc::CallbackServerContext* ctx,
                                                    const v1::CreateSessionRequest* req, v1::Session* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "CreateSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(std::string principal, c->Principal(ctx));
    const std::optional<std::string> md = ServiceContext::MetadataSessionId(ctx);
    ASSIGN_OR_RETURN(NewSessionArgs args, c->CheckCreateSession(*req, md ? &*md : nullptr));
    c->CreateSession(principal, std::move(args), {req->labels().begin(), req->labels().end()},
                     c->AnswerSession(reactor, "CreateSession", r));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::GetSession(grpc::CallbackServerContext* ctx, const v1::GetSessionRequest* req,
                                                 v1::Session* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "GetSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(CallTarget t, c->NamedSession(ctx, req->session_id()));
    c->GetSession(t.principal, t.session_id, c->AnswerSession(reactor, "GetSession", r));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::ListSessions(grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest*,
                                                   v1::ListSessionsResponse* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "ListSessions", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(std::string principal, c->Principal(ctx));
    for (const SessionInfo& info : c->ListSessions(principal)) FillSession(info, r->add_sessions());
    c->Answer(reactor, "ListSessions", absl::OkStatus());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::DeleteSession(grpc::CallbackServerContext* ctx,
                                                    const v1::DeleteSessionRequest* req, v1::DeleteSessionResponse*) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "DeleteSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(CallTarget t, c->NamedSession(ctx, req->session_id()));
    c->DeleteSession(t.principal, t.session_id,
                     [c, reactor](absl::Status s) { c->Answer(reactor, "DeleteSession", s); });
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::ForkSession(grpc::CallbackServerContext* ctx, const v1::ForkSessionRequest* req,
                                                  v1::Session* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "ForkSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(CallTarget t, c->NamedSession(ctx, req->session_id()));
    c->ForkSession(t.principal, t.session_id, req->position(), {req->labels().begin(), req->labels().end()},
                   c->AnswerSession(reactor, "ForkSession", r));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::RewindSession(grpc::CallbackServerContext* ctx,
                                                    const v1::RewindSessionRequest* req, v1::Session* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "RewindSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(CallTarget t, c->NamedSession(ctx, req->session_id()));
    c->RewindSession(t.principal, t.session_id, req->position(), c->AnswerSession(reactor, "RewindSession", r));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::MigrateSession(grpc::CallbackServerContext* ctx,
                                                     const v1::MigrateSessionRequest* req, v1::Session* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "MigrateSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(CallTarget t, c->NamedSession(ctx, req->session_id()));
    c->MigrateSession(t.principal, t.session_id, req->model(), c->AnswerSession(reactor, "MigrateSession", r));
    return absl::OkStatus();
  });
}

}  // namespace txl
