// TxlService: the txl.v1.TransformerXL gRPC service (callback API), split by
// call family: session_calls.cc (the unary session calls), generate_calls.cc
// (Generate, Converse), score_call.cc, transfer_calls.cc (Export, Import).
// Reactors validate requests (request_validation.h, the one owner of
// validation), take sessions out of the table and hand work to the
// scheduler; they never block and never run model code. Every absl status
// becomes a gRPC status in one place (call_context.h, ToGrpcStatus).
//
// Authentication: with a token table, every call must carry
// "authorization: Bearer <token>" (else UNAUTHENTICATED) and runs as the
// token's principal; without one, every caller is the anonymous principal "".
// The session table keeps sessions apart by principal (server/sessions/session_table.h).
#ifndef TXL_SERVER_GRPC_SERVICE_H_
#define TXL_SERVER_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "proto/txl/v1/txl.grpc.pb.h"
#include "server/batching/scheduler.h"
#include "server/core/service_core.h"

namespace txl {

struct ServiceContext;  // call_context.h

// Threading: all methods run on gRPC threads and are thread-safe; the
// engine, table, scheduler and tokens must outlive the service.
class TxlService final : public v1::TransformerXL::CallbackService {
 public:
  // `parts.tokens` null: no authentication.
  explicit TxlService(ServiceParts parts);

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const v1::GetModelInfoRequest* req,
                                         v1::ModelInfo* resp) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx, const v1::ListModelsRequest* req,
                                       v1::ListModelsResponse* resp) override;
  grpc::ServerUnaryReactor* LoadModel(grpc::CallbackServerContext* ctx, const v1::LoadModelRequest* req,
                                      v1::ListModelsResponse* resp) override;
  grpc::ServerUnaryReactor* UnloadModel(grpc::CallbackServerContext* ctx, const v1::UnloadModelRequest* req,
                                        v1::ListModelsResponse* resp) override;
  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* ctx, const v1::CreateSessionRequest* req,
                                          v1::Session* resp) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* ctx, const v1::GetSessionRequest* req,
                                       v1::Session* resp) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* ctx, const v1::ListSessionsRequest* req,
                                         v1::ListSessionsResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteSession(grpc::CallbackServerContext* ctx, const v1::DeleteSessionRequest* req,
                                          v1::DeleteSessionResponse* resp) override;
  grpc::ServerUnaryReactor* ForkSession(grpc::CallbackServerContext* ctx, const v1::ForkSessionRequest* req,
                                        v1::Session* resp) override;
  grpc::ServerUnaryReactor* RewindSession(grpc::CallbackServerContext* ctx, const v1::RewindSessionRequest* req,
                                          v1::Session* resp) override;
  grpc::ServerUnaryReactor* MigrateSession(grpc::CallbackServerContext* ctx, const v1::MigrateSessionRequest* req,
                                           v1::Session* resp) override;
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* req) override;
  grpc::ServerBidiReactor<v1::GenerateRequest, v1::GenerateResponse>* Converse(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* ctx, const v1::ScoreRequest* req,
                                  v1::ScoreResponse* resp) override;
  grpc::ServerWriteReactor<v1::SessionChunk>* ExportSession(grpc::CallbackServerContext* ctx,
                                                            const v1::ExportSessionRequest* req) override;
  grpc::ServerReadReactor<v1::ImportSessionRequest>* ImportSession(grpc::CallbackServerContext* ctx,
                                                                   v1::Session* resp) override;

  ~TxlService() override;

  // The core the service adapts (the HTTP routes call it too).
  const ServiceCore* core() const;

 private:
  std::unique_ptr<ServiceContext> ctx_;  // outlives every reactor: the server shuts down first
};

}  // namespace txl

#endif  // TXL_SERVER_GRPC_SERVICE_H_
