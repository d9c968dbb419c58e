// The unary calls on sessions: GetModelInfo, CreateSession, GetSession,
// ListSessions, DeleteSession, ForkSession, RewindSession. Each either fails at once or
// answers itself (now, or once the journal or the engine thread is done).
#include <memory>

#include "base/status_macros.h"
#include "server/api/call_context.h"
#include "server/api/service.h"
#include "server/durability/new_session.h"
#include "server/sessions/session_export.h"

namespace txl {

grpc::ServerUnaryReactor* TxlService::GetModelInfo(grpc::CallbackServerContext* ctx, const v1::GetModelInfoRequest*,
                                                   v1::ModelInfo* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "GetModelInfo", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    RETURN_IF_ERROR(c->Principal(ctx).status());
    const ModelConfig& m = c->model;
    r->set_n_token(m.n_token);
    r->set_n_layer(m.n_layer);
    r->set_n_head(m.n_head);
    r->set_d_model(m.d_model);
    r->set_d_head(m.d_head);
    r->set_d_inner(m.d_inner);
    r->set_d_embed(m.embed_dim());
    r->set_div_val(m.div_val);
    for (int64_t cutoff : m.cutoffs) r->add_cutoffs(cutoff);
    r->set_pre_lnorm(m.pre_lnorm);
    r->set_clamp_len(m.clamp_len);
    const TokenizerKind k = c->tokenizer.kind();
    r->set_tokenizer(k == TokenizerKind::kByte ? "byte" : k == TokenizerKind::kChar ? "char" : "word");
    r->set_vocab_size(c->tokenizer.vocab_size());
    r->set_default_mem_len(c->config.default_mem_len);
    r->set_max_mem_len(c->config.max_mem_len);
    r->set_device(c->config.device);
    r->set_dtype(c->config.dtype);
    r->set_kv_dtype(c->config.kv_dtype);
    r->set_model_path(c->config.model_path);
    r->set_fingerprint(c->engine->fingerprint());
    c->Answer(reactor, "GetModelInfo", absl::OkStatus());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::CreateSession(grpc::CallbackServerContext* ctx,
                                                    const v1::CreateSessionRequest* req, v1::Session* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "CreateSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(std::string principal, c->Principal(ctx));
    const std::optional<std::string> md = ServiceContext::MetadataSessionId(ctx);
    ASSIGN_OR_RETURN(NewSessionArgs args, c->validator.CreateSession(*req, md ? &*md : nullptr));
    // A session made now would die with the process moments later.
    if (c->scheduler->draining()) return absl::UnavailableError("the server is shutting down");
    if (c->journal != nullptr) RETURN_IF_ERROR(c->journal->Writable());  // it could not be made durable
    ASSIGN_OR_RETURN(std::unique_ptr<SessionState> state, c->engine->NewSession(args.mem_len));
    std::map<std::string, std::string> labels(req->labels().begin(), req->labels().end());
    if (c->journal == nullptr) {
      ASSIGN_OR_RETURN(SessionInfo info, c->table->Create(principal, std::move(state), args.idle_ttl, std::move(labels),
                                                          absl::Now(), args.session_id));
      FillSession(info, r);
      c->Answer(reactor, "CreateSession", absl::OkStatus());
      return absl::OkStatus();
    }
    // Journaled: busy (requests on it get ABORTED) until its creation is
    // written, and answered only then, so a crash after the answer keeps it.
    ASSIGN_OR_RETURN(SessionLease lease,
                     c->table->CreateAcquired(principal, std::move(state), args.idle_ttl, std::move(labels),
                                              absl::Now(), args.session_id, /*durable=*/true));
    ASSIGN_OR_RETURN(SessionInfo info, c->table->Get(principal, lease.id));
    SessionExport fresh;  // an empty state: the journal rebuilds it from mem_len
    fresh.fingerprint = c->engine->fingerprint();
    RecordNewSession(c->journal, c->table, info, std::move(lease), EncodeSessionExport(fresh),
                     [c, reactor, r](absl::Status written, const SessionInfo& made) {
                       if (written.ok()) FillSession(made, r);
                       c->Answer(reactor, "CreateSession", written);
                     });
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::GetSession(grpc::CallbackServerContext* ctx, const v1::GetSessionRequest* req,
                                                 v1::Session* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "GetSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(CallTarget t, c->NamedSession(ctx, req->session_id()));
    c->WithAdoption(
        t.principal, t.session_id,
        [c, reactor, r, t]() -> absl::Status {
          ASSIGN_OR_RETURN(SessionInfo info, c->table->Get(t.principal, t.session_id));
          FillSession(info, r);
          c->Answer(reactor, "GetSession", absl::OkStatus());
          return absl::OkStatus();
        },
        [c, reactor](absl::Status s) { c->Answer(reactor, "GetSession", s); });
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::ListSessions(grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest*,
                                                   v1::ListSessionsResponse* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "ListSessions", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(std::string principal, c->Principal(ctx));
    for (const SessionInfo& info : c->table->List(principal)) FillSession(info, r->add_sessions());
    c->Answer(reactor, "ListSessions", absl::OkStatus());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::DeleteSession(grpc::CallbackServerContext* ctx,
                                                    const v1::DeleteSessionRequest* req, v1::DeleteSessionResponse*) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "DeleteSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(CallTarget t, c->NamedSession(ctx, req->session_id()));
    c->WithAdoption(
        t.principal, t.session_id,
        [c, reactor, t]() -> absl::Status {
          if (c->journal == nullptr) {
            RETURN_IF_ERROR(c->table->Delete(t.principal, t.session_id));
            c->Answer(reactor, "DeleteSession", absl::OkStatus());
            return absl::OkStatus();
          }
          // Journaled: busy until the state store has deleted it; if it
          // fails, the session stays (here and there) and the client is told.
          ASSIGN_OR_RETURN(SessionLease lease, c->table->Acquire(t.principal, t.session_id, absl::Now()));
          if (!lease.durable) {  // not journaled (a Converse stream's own session)
            c->table->Discard(std::move(lease));
            c->Answer(reactor, "DeleteSession", absl::OkStatus());
            return absl::OkStatus();
          }
          if (absl::Status w = c->journal->Writable(); !w.ok()) {
            c->table->Release(std::move(lease), absl::Now());
            return w;
          }
          auto held = std::make_shared<SessionLease>(std::move(lease));
          c->journal->RecordDelete(t.session_id, [c, reactor, held](absl::Status written) {
            if (written.ok()) {
              c->table->Discard(std::move(*held));
            } else {
              c->table->Release(std::move(*held), absl::Now());
            }
            c->Answer(reactor, "DeleteSession", written);
          });
          return absl::OkStatus();
        },
        [c, reactor](absl::Status s) { c->Answer(reactor, "DeleteSession", s); });
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::ForkSession(grpc::CallbackServerContext* ctx, const v1::ForkSessionRequest* req,
                                                  v1::Session* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "ForkSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(CallTarget t, c->NamedSession(ctx, req->session_id()));
    RETURN_IF_ERROR(RequestValidator::HistoryPosition(req->position()));
    std::map<std::string, std::string> labels(req->labels().begin(), req->labels().end());
    const int64_t position = req->position();
    c->WithAdoption(
        t.principal, t.session_id,
        [c, reactor, r, t, labels, position]() -> absl::Status {
          ASSIGN_OR_RETURN(SessionLease lease, c->table->Acquire(t.principal, t.session_id, absl::Now()));
          auto source = c->table->Get(t.principal, t.session_id);  // the fork keeps its ttl
          JobCallbacks cb;
          cb.on_done = [c, reactor, r](absl::Status s, JobResult result) {
            if (s.ok()) FillSession(result.forked, r);
            c->Answer(reactor, "ForkSession", s);
          };
          return c->scheduler
              ->SubmitFork(std::move(lease), source.ok() ? source->idle_ttl : absl::ZeroDuration(), labels, position,
                           std::move(cb))
              .status();
        },
        [c, reactor](absl::Status s) { c->Answer(reactor, "ForkSession", s); });
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::RewindSession(grpc::CallbackServerContext* ctx,
                                                    const v1::RewindSessionRequest* req, v1::Session* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "RewindSession", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    ASSIGN_OR_RETURN(CallTarget t, c->NamedSession(ctx, req->session_id()));
    RETURN_IF_ERROR(RequestValidator::HistoryPosition(req->position()));
    const int64_t position = req->position();
    c->WithAdoption(
        t.principal, t.session_id,
        [c, reactor, r, t, position]() -> absl::Status {
          ASSIGN_OR_RETURN(SessionLease lease, c->table->Acquire(t.principal, t.session_id, absl::Now()));
          JobCallbacks cb;
          cb.on_done = [c, reactor, r, t](absl::Status s, JobResult) {
            if (s.ok()) {
              auto info = c->table->Get(t.principal, t.session_id);
              s = info.status();
              if (info.ok()) FillSession(*info, r);
            }
            c->Answer(reactor, "RewindSession", s);
          };
          return c->scheduler->SubmitRewind(std::move(lease), position, std::move(cb)).status();
        },
        [c, reactor](absl::Status s) { c->Answer(reactor, "RewindSession", s); });
    return absl::OkStatus();
  });
}

}  // namespace txl
